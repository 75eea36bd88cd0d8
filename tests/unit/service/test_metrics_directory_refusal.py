"""agentkv_directory_refuses_writes{reason}: every reason's series from 0 at start (an alert
on it needs no absent()), 1 for the reason the head's probe saw, back to 0 when it ends."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import ServiceMetrics
from store.directory import WriteRefusal


def refusals(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_directory_refuses_writes"}


def test_a_fresh_service_exports_every_reason_at_zero() -> None:
    assert refusals(ServiceMetrics()) == {r.value: 0.0 for r in WriteRefusal}
    assert "out_of_memory" in refusals(ServiceMetrics())


def test_a_refusal_is_one_while_it_lasts_and_leaves_directory_up_alone() -> None:
    m = ServiceMetrics()
    m.set_directory_refusal(WriteRefusal.OUT_OF_MEMORY)
    assert refusals(m) == {r.value: float(r is WriteRefusal.OUT_OF_MEMORY) for r in WriteRefusal}
    assert m.directory_up._value.get() == 1  # reads answer: not an outage
    m.set_directory_refusal(None)
    assert refusals(m) == {r.value: 0.0 for r in WriteRefusal}
