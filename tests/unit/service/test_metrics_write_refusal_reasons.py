"""agentkv_directory_refuses_writes{reason}: each way Redis refuses every write (out of
memory, a read-only replica, failing persistence) has its own reason series, each from 0,
and only the reason the probe saw is 1."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import ServiceMetrics
from store.directory import (
    DirectoryFull,
    PersistenceFailing,
    ReadOnlyReplica,
    WriteRefusal,
)

REASONS = {"out_of_memory", "read_only_replica", "persistence_failing"}


def refusals(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["reason"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_directory_refuses_writes"}


def test_every_reason_is_exported_at_zero_from_start() -> None:
    assert {r.value for r in WriteRefusal} == REASONS
    assert refusals(ServiceMetrics()) == dict.fromkeys(REASONS, 0.0)


@pytest.mark.parametrize("refused", [DirectoryFull, ReadOnlyReplica, PersistenceFailing])
def test_the_refusal_the_probe_saw_is_the_one_series_at_one(refused) -> None:
    m = ServiceMetrics()
    m.set_directory_refusal(refused.reason)  # what the head's probe passes on
    assert refusals(m) == {r: float(r == refused.reason.value) for r in REASONS}
    m.set_directory_refusal(None)
    assert refusals(m) == dict.fromkeys(REASONS, 0.0)
