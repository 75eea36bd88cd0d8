"""A session-close barrier under tensor (or pipeline) parallelism: every worker writes its
own part of a request's blocks and reports the barrier passed when its own saves are
written. The reports went through vLLM's merge of the workers' metadata as a set union,
so the first worker's report released the close while the others' saves were queued.
Runs vLLM's own ``KVOutputAggregator`` over two workers' step outputs."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput

from agentkv_cluster.engines.vllm.meta import AgentKVWorkerMeta, BarrierReports


def _step(*reports: set[str] | None):
    """One step's outputs, a worker each: the requests whose barrier it saw pass."""
    return [replace(EMPTY_MODEL_RUNNER_OUTPUT, kv_connector_output=KVConnectorOutput(
        kv_connector_worker_meta=AgentKVWorkerMeta(passed=dict.fromkeys(r, 1)) if r else None))
        for r in reports]


def _released(aggregator: KVOutputAggregator, barriers: BarrierReports, step) -> set[str]:
    meta = aggregator.aggregate(step).kv_connector_output.kv_connector_worker_meta
    return barriers.passed(meta.passed) if isinstance(meta, AgentKVWorkerMeta) else set()


def test_a_barrier_passes_once_every_worker_reported_it_across_steps():
    aggregator, barriers = KVOutputAggregator(expected_finished_count=2), BarrierReports(2)
    assert _released(aggregator, barriers, _step({"a", "b"}, None)) == set()  # rank 1 lags
    assert _released(aggregator, barriers, _step(None, {"a"})) == {"a"}
    assert _released(aggregator, barriers, _step({"c"}, {"b", "c"})) == {"b", "c"}
    assert _released(aggregator, barriers, _step(None, None)) == set()


def test_one_worker_releases_at_its_own_report():
    barriers = BarrierReports(1)
    assert barriers.passed({"a": 1}) == {"a"} and barriers.passed({}) == set()
    with pytest.raises(ValueError, match="workers must be >= 1"):
        BarrierReports(0)
