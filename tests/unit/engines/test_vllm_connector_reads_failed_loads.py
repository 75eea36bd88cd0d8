"""The connector's ``update_connector_output`` hands the
worker's report of a failed restore to the scheduler: the request is reported with the
tokens it really restored and the error, and the blocks vLLM recomputes are planned for
saving again, marked as planned knowing of the failure (``failures_seen``). Real
scheduler and worker sides through the connector's own two calls; vLLM's
``KVConnectorOutput`` carries the report, as in a step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.outputs import KVConnectorOutput

from agentkv_cluster.engines.vllm.backend import Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.connector import AgentKVConnector
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    AgentKVWorkerMeta,
    BarrierReports,
    BlockOp,
    RequestOps,
)
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.worker import WorkerSide
from tests.unit.engines.test_vllm_failed_loads import BS, VERSIONS, MissingStore, _request, _step


def _connector(sched: SchedulerSide, worker: WorkerSide) -> AgentKVConnector:
    """Both roles' sides in one connector (one process), without a VllmConfig."""
    conn = AgentKVConnector.__new__(AgentKVConnector)
    conn._scheduler, conn._worker, conn._barriers = sched, worker, BarrierReports(1)
    conn._stats_file = None
    return conn


def test_a_failed_restore_reaches_the_scheduler_through_the_connector():
    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                          async_load=False, min_tail_tokens=0)
    worker = WorkerSide(MissingStore(), ConnectorCounters(), background=False)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.zeros(8, 2, BS, 8)
                               for i in range(2)})
    conn = _connector(sched, worker)
    writer = _request("w", 2 * BS + 1, session="t")
    sched.arrived(writer)
    sched.get_num_new_matched_tokens(writer, 0)
    sched.build_connector_meta(_step(new=[(writer, [0, 1, 2], 0)]))  # blocks 0-1 planned
    req = _request("r", 2 * BS + 1)
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS, False)
    sched.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([3, 4, 5],)),
                                   2 * BS)
    meta = sched.build_connector_meta(_step(new=[(req, [3, 4, 5], 2 * BS)]))
    worker.begin_step(meta)  # the store holds neither block: both loads fail
    worker.finish_loads()
    worker.wait_for_save(meta)
    errors = conn.get_block_ids_with_load_errors()
    assert errors == {3, 4}  # vLLM recomputes them
    conn.update_connector_output(KVConnectorOutput(
        kv_connector_worker_meta=conn.build_connector_worker_meta(), invalid_block_ids=errors))
    again = sched.build_connector_meta(_step(cached=[(req, [], 0)]))
    assert again.failures_seen == 1  # the worker saves what this step plans
    assert [op.identity.start for r in again.requests for op in r.saves] == [0, BS]
    report = sched.request_finished(req, [3, 4, 5])[1]["agentkv"]
    assert report["restored_tokens"] == 0
    assert any("could not be restored" in e for e in report["errors"])
    worker.close()


def test_skipped_saves_reach_the_scheduler_through_the_connector():
    """Saves planned before the scheduler read a failed load are skipped by the worker; the
    connector hands those reports and vLLM's invalid blocks on: the skipped saves are
    planned again, except those of a request holding a block that failed to load."""
    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                          async_load=False, min_tail_tokens=0)
    worker = WorkerSide(MissingStore(), ConnectorCounters(), background=False)
    worker.register_kv_caches({"model.layers.0.attn": torch.zeros(8, 2, BS, 8)})
    conn = _connector(sched, worker)
    a, b = _request("a", 2 * BS + 1, session="t"), _request("b", 3 * BS + 1, session="u")
    for req in (a, b):
        sched.arrived(req)
        sched.get_num_new_matched_tokens(req, 0)
    planned = sched.build_connector_meta(_step(new=[(a, [0, 1, 2], 0), (b, [3, 4, 5, 6], 0)]))
    assert len(planned.requests) == 2 and planned.failures_seen == 0
    lost = sched.matcher.identities(b, sched._reqs["b"].hashes, 2, "acme")[1]
    failing = AgentKVConnectorMetadata(requests=[RequestOps(
        "r", Caller(tenant="acme", session="v"), loads=(BlockOp(lost, 4),))])
    for meta in (failing, planned):  # r's load fails (block 4, b's), then the step planned
        worker.begin_step(meta)  # before the scheduler read it
        worker.finish_loads()
        worker.wait_for_save(meta)
    errors = conn.get_block_ids_with_load_errors()
    assert errors == {4}
    conn.update_connector_output(KVConnectorOutput(
        kv_connector_worker_meta=conn.build_connector_worker_meta(), invalid_block_ids=errors))
    again = sched.build_connector_meta(_step(cached=[(a, [], 2 * BS + 1), (b, [], 3 * BS + 1)]))
    assert [(r.req_id, [op.identity.start for op in r.saves]) for r in again.requests] == \
        [("a", [0, BS])]


def test_a_barrier_passes_once_every_worker_reported_it():
    """With two workers (tensor parallel) each writes its part of the blocks: the
    connector releases a barrier's request only when both reported it passed, in one step
    or across steps (``BarrierReports``); counted per report, a close went out while the
    other worker's saves were still queued."""
    released: list[set[str]] = []

    class Recording(SchedulerSide):
        def released(self, req_ids: set[str]) -> None:
            released.append(set(req_ids))
            super().released(req_ids)

    sched = Recording(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                      ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                      async_load=False, min_tail_tokens=0)
    conn = _connector(sched, None)  # type: ignore[arg-type] - the scheduler's role only
    conn._barriers = BarrierReports(2)
    for _ in range(2):  # one worker's report per step
        conn.update_connector_output(KVConnectorOutput(
            kv_connector_worker_meta=AgentKVWorkerMeta(passed={"r": 1})))
    assert released == [set(), {"r"}]
