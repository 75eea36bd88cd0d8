"""Tenant labels on /metrics: blinded by default, stable for one key, bounded to the first
N tenants seen, and gone once a tenant is erased."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import OTHER, ServiceMetrics, blinded_tenant
from agentkv_cluster.runtime.records import LoadPhases

KEY = b"k" * 32


def tenants_in(m: ServiceMetrics) -> set[str]:
    text = m.exposition().decode()
    return {s.labels["tenant"] for fam in text_string_to_metric_families(text)
            for s in fam.samples if "tenant" in s.labels}


def test_labels_are_blinded_and_stable_for_one_key() -> None:
    a, b = ServiceMetrics(label_key=KEY), ServiceMetrics(label_key=KEY)
    a.transfer("acme", "host", 1)
    b.transfer("acme", "host", 1)
    assert tenants_in(a) == tenants_in(b) == {blinded_tenant("acme", KEY)}
    assert "acme" not in a.exposition().decode()
    other_key = ServiceMetrics(label_key=b"x" * 32)
    other_key.transfer("acme", "host", 1)
    assert tenants_in(other_key) != tenants_in(a)  # keyed: names cannot be tested without it
    assert blinded_tenant("acme", KEY).startswith("t-") and len(blinded_tenant("acme", KEY)) == 14


def test_names_only_when_the_operator_opts_in() -> None:
    m = ServiceMetrics(label_key=KEY, tenant_names=True)
    m.recompute("acme", 5)
    assert tenants_in(m) == {"acme"}


def test_the_first_n_tenants_seen_keep_their_labels() -> None:
    m = ServiceMetrics(top_tenants=2, tenant_names=True)
    for tenant, nbytes in (("small", 1), ("tiny", 1), ("huge", 10**9)):
        m.transfer(tenant, "host", nbytes)
    m.transfer("small", "host", 1)  # a label, once given, stays with its tenant
    assert tenants_in(m) == {"small", "tiny", OTHER}


def test_an_erased_tenant_is_no_longer_named() -> None:
    m = ServiceMetrics(label_key=KEY)
    for tenant in ("acme", "globex"):
        m.restore(tenant, "host", 0.01, 0.02)
        m.lookup(tenant, 1, 1, 128, 128)
        m.transfer(tenant, "nvme", 10)
    m.erased("acme", failed=False)
    assert tenants_in(m) == {blinded_tenant("globex", KEY)}
    m.transfer("acme", "host", 1)  # a late straggler is counted, but never named again
    assert tenants_in(m) == {blinded_tenant("globex", KEY), OTHER}
    assert 'agentkv_erasures_total{result="ok"} 1.0' in m.exposition().decode()


def test_a_loads_phases_land_in_one_histogram_series_each() -> None:
    m = ServiceMetrics()
    m.loaded(LoadPhases(settle_s=0.01, blocked_s=0.2, transfer_s=0.03, total_s=0.24))
    text = m.exposition().decode()
    sums = {s.labels["phase"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_load_phase_seconds_sum"}
    assert sums == {"settle": 0.01, "blocked": 0.2, "transfer": 0.03, "arrival": 0.0,
                    "total": 0.24}


def test_a_tenant_called_other_is_not_merged_into_the_overflow_bucket() -> None:
    m = ServiceMetrics(top_tenants=2, tenant_names=True)
    for tenant, nbytes in (("acme", 1), ("other", 10), ("zeta", 100), ("yeti", 1000)):
        m.transfer(tenant, "host", nbytes)
    text = m.exposition().decode()
    got = {s.labels["tenant"]: s.value for fam in text_string_to_metric_families(text)
           for s in fam.samples if s.name == "agentkv_transfer_bytes_total"}
    assert got == {"acme": 1, "other": 10, OTHER: 1100}
    assert OTHER not in ("other", blinded_tenant("other", KEY))
