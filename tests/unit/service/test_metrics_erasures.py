"""agentkv_erasures_total{result}: both series exist from the start at 0, so the chart's
AgentKVErasureFailed alert (increase() over the failed series) sees the first failure."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import ServiceMetrics


def erasures(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["result"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_erasures_total"}


def test_a_fresh_service_exports_both_results_at_zero() -> None:
    assert erasures(ServiceMetrics()) == {"ok": 0.0, "failed": 0.0}


def test_the_first_failure_counts_one_on_the_series_already_at_zero() -> None:
    m = ServiceMetrics(tenant_names=True)
    m.transfer("acme", "host", 1)
    m.erased("acme", failed=True)
    assert erasures(m) == {"ok": 0.0, "failed": 1.0}
    m.erased("globex", failed=False)  # forgetting tenants never drops the result series
    assert erasures(m) == {"ok": 1.0, "failed": 1.0}
