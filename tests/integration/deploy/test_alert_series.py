"""The chart's alerts against the series the service really exports: promtool's rule unit
tests fed with what a ServiceMetrics scrape shows before and after the event."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import ServiceMetrics
from tests.integration.deploy import chart
from tests.integration.deploy.test_operability import _promtool

pytestmark = pytest.mark.integration

RULES = {"monitoring": {"prometheusRule": {"enabled": True}}}


def _rules(tmp_path) -> tuple[str, dict[str, dict]]:
    (rule,) = [d for path, text in chart.render_values(RULES).items()
               if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text)
               if d and d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return str(path), {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def _sample(m: ServiceMetrics, name: str, **labels: str) -> str:
    """The sample's value as promtool writes it; `_` (no sample) when the series is absent."""
    text = m.exposition().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return f"{s.value:g}"
    return "_"


def _promtool_test(tmp_path, rules: str, series: list[dict], checks: list[dict]) -> None:
    tests = {"rule_files": [rules], "evaluation_interval": "30s", "tests": [
        {"interval": "30s", "input_series": series, "alert_rule_test": checks}]}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_erasure_failed_fires_on_the_first_failure_of_a_fresh_service(tmp_path):
    _promtool()  # skip before rendering when it is absent
    rules, alerts = _rules(tmp_path)
    m = ServiceMetrics()
    before = _sample(m, "agentkv_erasures_total", result="failed")
    m.erased("acme", failed=True)
    after = _sample(m, "agentkv_erasures_total", result="failed")
    assert after == "1"
    # 10 minutes of scrapes of the fresh service, then an hour after its first failure.
    series = [{"series": 'agentkv_erasures_total{job="agentkv",result="failed"}',
               "values": f"{before}x20 {after}x120"}]
    notes = alerts["AgentKVErasureFailed"]["annotations"]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "5m", "alertname": "AgentKVErasureFailed", "exp_alerts": []},
        {"eval_time": "15m", "alertname": "AgentKVErasureFailed", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "severity": "critical"},
             "exp_annotations": notes}]}])


def test_verification_rejects_alert_keeps_the_pool_it_tells_to_investigate(tmp_path):
    rules, alerts = _rules(tmp_path)
    rule = alerts["AgentKVVerificationRejects"]
    (grouping,) = re.findall(r"sum by \(([^)]*)\)", rule["expr"])
    assert "pool" in [label.strip() for label in grouping.split(",")]
    notes = {k: v.replace("{{ $labels.pool }}", "pool-3")
             for k, v in rule["annotations"].items()}
    assert "pool-3" in notes["description"]
    m = ServiceMetrics()
    m.reject("pool-3", 0)  # what the service's refresh does for each pool it sees
    before = _sample(m, "agentkv_verification_rejects_total", pool="pool-3")
    m.reject("pool-3", 2)
    after = _sample(m, "agentkv_verification_rejects_total", pool="pool-3")
    series = [
        {"series": 'agentkv_verification_rejects_total{job="agentkv",pool="pool-3"}',
         "values": f"{before}x20 {after}x40"},
        {"series": 'agentkv_verification_rejects_total{job="agentkv",pool="pool-0"}',
         "values": "0x60"},
    ]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "5m", "alertname": "AgentKVVerificationRejects", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "AgentKVVerificationRejects", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "pool": "pool-3", "severity": "critical"},
             "exp_annotations": notes}]}])


def test_pool_tiers_full_fires_for_the_pool_that_refused_and_not_for_spills(tmp_path):
    rules, alerts = _rules(tmp_path)
    rule = alerts["AgentKVPoolTiersFull"]
    notes = {k: v.replace("{{ $labels.pool }}", "pool-1")
             for k, v in rule["annotations"].items()}
    m = ServiceMetrics()
    m.nvme_full("pool-1", 0, 0)  # what the feed does for each pool it sees
    before = _sample(m, "agentkv_nvme_full_stores_total", pool="pool-1", outcome="refused")
    m.nvme_full("pool-1", 3, 2)
    after = _sample(m, "agentkv_nvme_full_stores_total", pool="pool-1", outcome="refused")
    spilled = _sample(m, "agentkv_nvme_full_stores_total", pool="pool-1", outcome="spilled")
    assert (before, after, spilled) == ("0", "2", "3")
    series = [
        {"series": 'agentkv_nvme_full_stores_total{job="agentkv",pool="pool-1",'
                   'outcome="refused"}', "values": f"{before}x20 {after}x40"},
        {"series": 'agentkv_nvme_full_stores_total{job="agentkv",pool="pool-0",'
                   'outcome="spilled"}', "values": "0x20 5x40"},  # spills alone: no alert
    ]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "5m", "alertname": "AgentKVPoolTiersFull", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "AgentKVPoolTiersFull", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "pool": "pool-1", "severity": "critical"},
             "exp_annotations": notes}]}])


def test_scrape_part_unanswered_fires_per_part_after_minutes_of_silence(tmp_path):
    """A pool that stops answering scrapes pages after 5 minutes and names the part; a part
    that misses a scrape or two now and then, and the parts that answer, never do."""
    rules, alerts = _rules(tmp_path)
    rule = alerts["AgentKVScrapePartUnanswered"]
    assert rule["for"] == "5m"
    m = ServiceMetrics()
    m.set_scrape_parts({"controller": True, "pool/pool-1": True, "pool/pool-2": True})
    ok = _sample(m, "agentkv_scrape_part_ok", part="pool/pool-1")
    m.set_scrape_parts({"controller": True, "pool/pool-1": False, "pool/pool-2": False})
    hung = _sample(m, "agentkv_scrape_part_ok", part="pool/pool-1")
    assert (ok, hung) == ("1", "0")
    assert _sample(m, "agentkv_scrape_part_ok", part="controller") == "1"
    notes = {k: v.replace("{{ $labels.part }}", "pool/pool-1")
             for k, v in rule["annotations"].items()}
    assert "pool/pool-1" in notes["summary"]
    series = [  # scrapes every 30 s
        {"series": 'agentkv_scrape_part_ok{job="agentkv",part="controller"}',
         "values": f"{ok}x40"},
        # hung from 2 min on, for good
        {"series": 'agentkv_scrape_part_ok{job="agentkv",part="pool/pool-1"}',
         "values": f"{ok}x3 {hung}x36"},
        # a slow scrape every few minutes, answered by the next one
        {"series": 'agentkv_scrape_part_ok{job="agentkv",part="pool/pool-2"}',
         "values": " ".join([f"{ok} {ok} {ok} {ok} {ok} {hung}"] * 6)},
    ]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "6m", "alertname": "AgentKVScrapePartUnanswered", "exp_alerts": []},
        {"eval_time": "8m", "alertname": "AgentKVScrapePartUnanswered", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "part": "pool/pool-1", "severity": "warning"},
             "exp_annotations": notes}]}])


def test_directory_refuses_writes_fires_after_minutes_and_names_the_reason(tmp_path):
    """A Redis at maxmemory pages after 5 minutes of refusals; a refusal that clears within
    a minute or two does not."""
    from store.directory.base import WriteRefusal

    rules, alerts = _rules(tmp_path)
    rule = alerts["AgentKVDirectoryRefusesWrites"]
    m = ServiceMetrics()
    ok = _sample(m, "agentkv_directory_refuses_writes", reason="out_of_memory")
    m.set_directory_refusal(WriteRefusal.OUT_OF_MEMORY)
    full = _sample(m, "agentkv_directory_refuses_writes", reason="out_of_memory")
    assert (ok, full) == ("0", "1")
    notes = {k: v.replace("{{ $labels.reason }}", "out_of_memory")
             for k, v in rule["annotations"].items()}
    series = [  # scrapes every 30 s: full for 1 min at 1 min, then for good from 4 min on
        {"series": 'agentkv_directory_refuses_writes{job="agentkv",reason="out_of_memory"}',
         "values": f"{ok}x1 {full}x2 {ok}x4 {full}x30"}]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "3m", "alertname": "AgentKVDirectoryRefusesWrites", "exp_alerts": []},
        {"eval_time": "10m", "alertname": "AgentKVDirectoryRefusesWrites", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "reason": "out_of_memory", "severity": "critical"},
             "exp_annotations": notes}]}])


def test_nvme_reserve_spent_fires_for_the_pool_drawing_on_it_and_not_for_a_zero_reserve(
        tmp_path):
    """A full file system under one pool's shard draws on its reserve for 5 minutes: that
    pool is named. A pool configured with no reserve (target 0) and a full one never fire."""
    rules, alerts = _rules(tmp_path)
    rule = alerts["AgentKVNvmeReserveSpent"]
    assert rule["for"] == "5m"
    notes = {k: v.replace("{{ $labels.pool }}", "pool-1")
             for k, v in rule["annotations"].items()}
    m = ServiceMetrics()
    m.set_nvme_reserves({"pool-0": (256 << 10, 256 << 10), "pool-1": (256 << 10, 256 << 10),
                         "pool-2": (0, 0)})
    full = _sample(m, "agentkv_nvme_reserve_bytes", pool="pool-1")
    target = _sample(m, "agentkv_nvme_reserve_target_bytes", pool="pool-1")
    m.set_nvme_reserves({"pool-0": (256 << 10, 256 << 10), "pool-1": (16 << 10, 256 << 10),
                         "pool-2": (0, 0)})
    drawn = _sample(m, "agentkv_nvme_reserve_bytes", pool="pool-1")
    assert (full, target, drawn) == (str(256 << 10), str(256 << 10), str(16 << 10))
    assert _sample(m, "agentkv_nvme_reserve_target_bytes", pool="pool-2") == "0"

    def pair(pool: str, held: str, target_: str) -> list[dict]:
        return [{"series": f'agentkv_nvme_reserve_bytes{{job="agentkv",pool="{pool}"}}',
                 "values": held},
                {"series": f'agentkv_nvme_reserve_target_bytes{{job="agentkv",pool="{pool}"}}',
                 "values": target_}]

    series = [*pair("pool-0", f"{full}x40", f"{target}x40"),
              *pair("pool-1", f"{full}x4 {drawn}x36", f"{target}x40"),  # drawn from 2 min on
              *pair("pool-2", "0x40", "0x40")]
    _promtool_test(tmp_path, rules, series, [
        {"eval_time": "5m", "alertname": "AgentKVNvmeReserveSpent", "exp_alerts": []},
        {"eval_time": "8m", "alertname": "AgentKVNvmeReserveSpent", "exp_alerts": [
            {"exp_labels": {"job": "agentkv", "pool": "pool-1", "severity": "warning"},
             "exp_annotations": notes}]}])
