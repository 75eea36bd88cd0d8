"""With tensor or pipeline parallelism every worker reports
the digests it did not save (its part of a block); the merged report holds each
worker's, so the scheduler's directory mirror stops matching a block any worker failed
to write (else a lookup claimed it, and its load failed into a recompute)."""

from __future__ import annotations

from agentkv_cluster.engines.vllm.meta import AgentKVWorkerMeta


def test_the_merged_worker_report_holds_every_workers_dropped_digests():
    rank0 = AgentKVWorkerMeta(dropped={b"a"})
    rank1 = AgentKVWorkerMeta(dropped={b"b"})
    assert rank0.aggregate(rank1).dropped == {b"a", b"b"}
    assert AgentKVWorkerMeta().aggregate(rank1).dropped == {b"b"}
