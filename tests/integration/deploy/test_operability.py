"""What an operator of the chart relies on: alerts that promtool accepts and that fire,
a dashboard whose every query names a metric the service exports, rendering that refuses a
pool its pod's memory limit cannot hold, the knobs operators expect, Redis probes that run
a real `redis-cli ping`, and NOTES that list the Secrets still missing."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import time

import helm_python as helm
import pytest
import yaml

from agentkv_cluster.api.metrics import ServiceMetrics
from tests.integration.deploy import chart
from tests.support.redis_proc import free_port

pytestmark = pytest.mark.integration

MONITORING = {"monitoring": {"dashboard": {"enabled": True},
                             "prometheusRule": {"enabled": True}}}
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "min", "max", "avg",
                "absent", "le", "without", "on", "ignoring", "and", "or", "unless", "bool"}


def _rendered(values: dict) -> dict[str, str]:
    return chart.render_values(values)


def _docs(values: dict) -> list[dict]:
    out = _rendered(values)
    return [d for path, text in out.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is absent (Debian package `prometheus`; scripts/test.sh installs "
                    "it when run as root)")
    return tool


def exported_metric_names() -> set[str]:
    """Every sample name the service's registry can expose (histogram and counter suffixes
    included), plus the process and platform collectors'."""
    names: set[str] = set()
    for family in ServiceMetrics().registry.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        elif family.type == "info":
            names.add(family.name + "_info")
        else:
            names.add(family.name)
        names |= {s.name for s in family.samples}
    return names


def _metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\{[^}]*\}", "", expr)  # selectors
    expr = re.sub(r"by \([^)]*\)", "", expr)  # grouping labels
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
            if w not in PROMQL_WORDS and not w.startswith("$")}


# -- alerts -------------------------------------------------------------------------------

def _rule_groups(tmp_path) -> tuple[str, dict]:
    (rule,) = [d for d in _docs(MONITORING) if d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return str(path), rule


def test_prometheus_rule_is_optional_and_passes_promtool(tmp_path):
    assert not [d for d in chart.documents("default") if d["kind"] == "PrometheusRule"]
    path, rule = _rule_groups(tmp_path)
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"AgentKVRestoreP95High", "AgentKVDirectoryUnreachable", "AgentKVTierNearFull",
            "AgentKVVerificationRejects", "AgentKVErasureFailed",
            "AgentKVScrapePartUnanswered", "AgentKVDirectoryRefusesWrites",
            "AgentKVPoolTiersFull", "AgentKVNvmeReserveSpent"} <= alerts
    exported = exported_metric_names()
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert _metric_names(r["expr"]) <= exported, r["alert"]
    done = subprocess.run([_promtool(), "check", "rules", path], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout


def test_alerts_fire_on_the_series_that_should_page(tmp_path):
    """promtool's rule unit tests: each alert fires on its condition and not before."""
    path, rule = _rule_groups(tmp_path)
    notes = {r["alert"]: r["annotations"] for g in rule["spec"]["groups"] for r in g["rules"]}

    def fired(alert: str, **labels: str) -> list[dict]:
        annotations = {k: v.replace("{{ $labels.tier }}", labels.get("tier", ""))
                       for k, v in notes[alert].items()}
        return [{"exp_labels": {"job": "agentkv", **labels}, "exp_annotations": annotations}]

    job = 'job="agentkv"'
    tests = {"rule_files": [path], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f"agentkv_directory_up{{{job}}}", "values": "1 1 0x10"},
            {"series": f'agentkv_tier_occupancy_bytes{{{job},tier="host"}}',
             "values": "50+5x20"},
            {"series": f'agentkv_tier_capacity_bytes{{{job},tier="host"}}', "values": "100x20"},
            {"series": f'agentkv_erasures_total{{{job},result="failed"}}', "values": "0 0 1x10"},
            {"series": f'agentkv_verification_rejects_total{{{job},pool="pool-0"}}',
             "values": "0x20"},
            {"series": f'agentkv_build_info{{{job},version="0.1.0",python="3.11"}}',
             "values": "1x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "AgentKVDirectoryUnreachable", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "AgentKVDirectoryUnreachable",
             "exp_alerts": fired("AgentKVDirectoryUnreachable", severity="critical")},
            {"eval_time": "5m", "alertname": "AgentKVTierNearFull", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "AgentKVTierNearFull",
             "exp_alerts": fired("AgentKVTierNearFull", severity="warning", tier="host")},
            {"eval_time": "4m", "alertname": "AgentKVErasureFailed",
             "exp_alerts": fired("AgentKVErasureFailed", severity="critical")},
            {"eval_time": "10m", "alertname": "AgentKVVerificationRejects", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "AgentKVAbsent", "exp_alerts": []},
        ]}]}
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    done = subprocess.run([_promtool(), "test", "rules", str(test_file)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- dashboard ----------------------------------------------------------------------------

def test_dashboard_is_optional_labelled_for_the_sidecar_and_names_exported_metrics():
    assert not [d for d in chart.documents("default") if d["metadata"]["name"].endswith(
        "-dashboard")]
    (cm,) = [d for d in _docs(MONITORING) if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["agentkv.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    exported = exported_metric_names()
    used = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names and names <= exported, (expr, names - exported)
        used |= names
    # The operator's first questions each have a panel.
    for name in ("agentkv_prefix_lookup_pages_total", "agentkv_request_duration_seconds_bucket",
                 "agentkv_restore_hidden_seconds_total", "agentkv_directory_up",
                 "agentkv_build_info", "process_resident_memory_bytes",
                 "agentkv_load_phase_seconds_bucket", "agentkv_pages_compressed_total",
                 "agentkv_nvme_reserve_bytes"):
        assert name in used, name


def test_the_metric_name_check_catches_a_typo():
    assert _metric_names('sum(rate(agentkv_restor_seconds_total{job=~"$job"}[5m]))') == {
        "agentkv_restor_seconds_total"}
    assert "agentkv_restor_seconds_total" not in exported_metric_names()


# -- memory -------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "field"), [
    ({"pool": {"hostPoolBytes": 128 << 30}}, "/pool/resources/limits/memory"),
    ({"head": {"hostPool": True, "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                               "limits": {"cpu": "4", "memory": "8Gi"}}}},
     "/head/resources/limits/memory"),
    ({"gpuWorkers": {"objectStoreBytes": 80 << 30}}, "/gpuWorkers/resources/limits/memory"),
])
def test_dev_shm_beyond_the_memory_limit_fails_rendering(values, field):
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values(values)
    assert f"at '{field}'" in str(info.value) and "OOM" in str(info.value)


def test_a_pool_that_fits_its_raised_limit_renders():
    values = {"pool": {"hostPoolBytes": 128 << 30,
                       "resources": {"requests": {"cpu": "4", "memory": "140Gi"},
                                     "limits": {"cpu": "4", "memory": "140Gi"}}}}
    assert chart.render_values(values)


# -- knobs --------------------------------------------------------------------------------

KNOBS = {
    "priorityClassName": "kv-critical",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"x": "y"}}}],
    "podAnnotations": {"example.com/owner": "ml-platform"},
    "podLabels": {"team": "kv"},
    "extraEnv": [{"name": "NCCL_DEBUG", "value": "INFO"}],
    "extraVolumes": [{"name": "extra", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
    "capabilities": ["IPC_LOCK"],
}


def _knob_values() -> dict:
    rdma = {"requests": {"cpu": "4", "memory": "24Gi", "rdma/hca": 1},
            "limits": {"cpu": "4", "memory": "24Gi", "rdma/hca": 1}}
    return {
        "head": {**copy.deepcopy(KNOBS), "podDisruptionBudget": {"enabled": True}},
        "gpuWorkers": copy.deepcopy(KNOBS),
        "pool": {**copy.deepcopy(KNOBS), "resources": rdma,
                 "updateStrategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"partition": 1}}},
        "redis": {"bundled": {**copy.deepcopy(KNOBS), "capabilities": [],
                              "updateStrategy": {"type": "OnDelete"},
                              "podDisruptionBudget": {"enabled": True}}},
        # IPC_LOCK is outside the restricted Pod Security Standard: an explicit choice.
        "containerSecurity": {"allowCapabilitiesBeyondRestricted": True},
    }


def _templates(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        if d["kind"] == "RayCluster":
            out["head"] = d["spec"]["headGroupSpec"]["template"]
            for g in d["spec"]["workerGroupSpecs"]:
                out[g["groupName"]] = g["template"]
        elif d["kind"] == "StatefulSet":
            out[d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = \
                d["spec"]["template"]
    return out


def test_operator_knobs_reach_every_workload():
    docs = _docs(_knob_values())
    templates = _templates(docs)
    assert set(templates) == {"head", "hbm-gpu", "pool", "redis"}
    for name, t in templates.items():
        spec, meta = t["spec"], t["metadata"]
        assert spec["priorityClassName"] == "kv-critical", name
        assert spec["topologySpreadConstraints"] == KNOBS["topologySpreadConstraints"], name
        assert meta["labels"]["team"] == "kv" and \
            meta["annotations"]["example.com/owner"] == "ml-platform", name
        assert {"name": "extra", "emptyDir": {}} in spec["volumes"], name
        main = spec["containers"][-1] if name == "head" else spec["containers"][0]
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in main["env"], name
        assert {"name": "extra", "mountPath": "/extra"} in main["volumeMounts"], name
        caps = main["securityContext"]["capabilities"]
        assert caps["drop"] == ["ALL"]
        assert caps.get("add", []) == ([] if name == "redis" else ["IPC_LOCK"]), name
    pool = templates["pool"]["spec"]["containers"][0]["resources"]
    assert pool["limits"]["rdma/hca"] == 1 and pool["requests"]["rdma/hca"] == 1
    sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    assert sts["agentkv-pool"]["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 1
    assert sts["agentkv-redis"]["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pdbs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert pdbs["agentkv-head"]["minAvailable"] == 1
    assert pdbs["agentkv-redis"]["selector"]["matchLabels"]["app.kubernetes.io/component"] \
        == "redis"
    assert "agentkv-pool" in pdbs
    report = chart.lint(_knob_values())
    assert not report["errors"], report["errors"]


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_every_container_has_a_read_only_root_filesystem(value_set):
    for name, t in chart.pod_templates(value_set).items():
        for c in t["spec"].get("initContainers", []) + t["spec"]["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (name, c["name"])
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            if name != "redis":  # Ray writes its session and sockets under /tmp
                assert "/tmp" in mounts, (name, c["name"])


def test_the_knob_can_turn_it_off():
    docs = _docs({"containerSecurity": {"readOnlyRootFilesystem": False}})
    for t in _templates(docs).values():
        for c in t["spec"]["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is False


def test_no_knob_is_rendered_when_unset():
    head = chart.pod_templates("default")["head"]["spec"]
    assert "priorityClassName" not in head and "topologySpreadConstraints" not in head
    assert not [d for d in chart.documents("default") if d["kind"] == "PodDisruptionBudget"
                and not d["metadata"]["name"].endswith("-pool")]


# -- Redis probes -------------------------------------------------------------------------

def test_redis_probes_run_an_authenticated_ping_against_a_real_redis(tmp_path):
    data = chart.one("default", "ConfigMap", "-redis")["data"]
    redis_c = chart.container(chart.pod_templates("default")["redis"], "redis")
    for probe in ("livenessProbe", "readinessProbe"):
        assert redis_c[probe]["exec"]["command"] == ["sh", "/etc/redis/conf/ping.sh"]
    assert {"name": "service-password", "mountPath": "/secrets/service", "readOnly": True} \
        in redis_c["volumeMounts"]
    secrets = tmp_path / "secrets"
    for user, pw in (("admin", "admin-pw"), ("service", "svc-Pass_word-1")):
        (secrets / user).mkdir(parents=True)
        (secrets / user / "password").write_text(pw)
    acl_dir = tmp_path / "acl"
    acl_dir.mkdir()
    build = data["build-acl.sh"].replace("/etc/redis/acl", str(acl_dir)).replace(
        "/secrets", str(secrets))
    subprocess.run(["sh", "-c", build], check=True, capture_output=True, timeout=30)
    port = free_port()
    conf = (data["redis.conf"].replace("/etc/redis/acl/users.acl", str(acl_dir / "users.acl"))
            .replace("dir /data", f"dir {tmp_path}").replace("port 6379", f"port {port}")
            .replace("bind 0.0.0.0", "bind 127.0.0.1").replace("appendonly yes",
                                                               "appendonly no"))
    (tmp_path / "redis.conf").write_text(conf)
    ping = data["ping.sh"].replace("/secrets", str(secrets)).replace("-p 6379", f"-p {port}")

    def probe() -> int:
        return subprocess.run(["sh", "-c", ping], capture_output=True, timeout=30,
                              check=False).returncode

    assert probe() != 0  # nothing listens yet
    proc = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while probe() != 0:
            assert time.monotonic() < deadline, "the probe never passed"
            time.sleep(0.1)
        (secrets / "service" / "password").write_text("wrong")
        assert probe() != 0  # a refused login is not a live Redis
    finally:
        proc.kill()
        proc.wait(timeout=10)


# -- NOTES --------------------------------------------------------------------------------

def test_notes_list_every_missing_secret():
    """Rendered without a cluster, `lookup` finds nothing: every Secret is listed."""
    notes = _rendered(chart.load_values("production-8gpu-4node"))["agentkv/templates/NOTES.txt"]
    missing = re.findall(r"^  - ([a-z0-9-]+): ", notes, flags=re.MULTILINE)
    merged = chart.merged_values("production-8gpu-4node")
    expected = {merged["ray"]["auth"]["secretName"],
                merged["security"]["tokenSecret"]["secretName"],
                merged["security"]["auditSigningKey"]["secretName"],
                *merged["security"]["tenantKeys"]["secretNames"],
                merged["redis"]["bundled"]["adminPasswordSecret"]["name"],
                merged["redis"]["bundled"]["servicePasswordSecret"]["name"],
                merged["redis"]["bundled"]["tls"]["secretName"],
                *(u["passwordSecret"]["name"] for u in merged["redis"]["bundled"]["tenantUsers"])}
    assert set(missing) == expected and len(missing) == len(expected)
    assert "MISSING SECRETS" in notes


def test_notes_of_the_embedded_directory_name_no_redis_secret():
    """cpu-demo's directory is embedded: no Redis Secret is read, and none may be listed
    (an empty line "  - : Redis URL with credentials" was)."""
    notes = _rendered(chart.load_values("cpu-demo"))["agentkv/templates/NOTES.txt"]
    listed = re.findall(r"^  - ([^:]*): (.*)$", notes, flags=re.MULTILINE)
    assert listed and all(name for name, _ in listed), listed
    assert not [what for _, what in listed if "Redis" in what], listed


def test_notes_warn_when_the_audit_log_is_ephemeral():
    """Persistence off (acknowledged, as cpu-demo does) is allowed, and said at install:
    the receipts an admin relies on are lost with every head pod."""
    ephemeral = _rendered(chart.load_values("cpu-demo"))["agentkv/templates/NOTES.txt"]
    kept = _rendered(chart.load_values("production-8gpu-4node"))["agentkv/templates/NOTES.txt"]
    assert "AUDIT LOG IS EPHEMERAL" in ephemeral and "erasure receipt" in ephemeral
    assert "AUDIT LOG IS EPHEMERAL" not in kept
