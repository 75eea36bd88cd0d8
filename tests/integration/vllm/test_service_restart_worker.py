"""The service restarts empty between two engine steps: vLLM's scheduler process notices
(its next lookup fails on the old connection, the one after misses) and plans the
prompt's blocks to be saved again; the worker process, which made no call in between,
must save them too. It used to skip every block it had stored before the restart (its
cache of stored keys said "held"), so that prefix was never restored again."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.engines.vllm.backend import BackendUnavailable, ConnectorCounters
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.service import ServiceBackend
from agentkv_cluster.engines.vllm.worker import WorkerSide
from tests.integration.vllm.test_service_backend_recovery import Live
from tests.integration.vllm.test_worker_modes import _ids, _kv

pytestmark = pytest.mark.integration


@pytest.fixture
def live():
    env = Live()
    yield env
    env.close()


def _save_step(worker: WorkerSide, caller, idents, outages: int) -> None:
    """One engine step that saves ``idents`` (vLLM blocks 0..n-1), as the scheduler plans."""
    meta = AgentKVConnectorMetadata(requests=[RequestOps(
        "r", caller, saves=tuple(BlockOp(ident, b) for b, ident in enumerate(idents)))],
        outages=outages)
    worker.begin_step(meta)
    worker.wait_for_save(meta)


def test_after_a_restart_the_scheduler_saw_the_worker_saves_the_blocks_again(live):
    sched = live.backend  # vLLM's scheduler process
    store = ServiceBackend(("127.0.0.1", live.port), timeout_s=5.0, retry_after_s=0.2)
    worker = WorkerSide(store, ConnectorCounters(), background=False)  # the worker process
    worker.register_kv_caches(_kv())
    try:
        token = live.svc.token("acme")
        caller = sched.resolve(token, "agent-w")
        idents = _ids(n=2)
        _save_step(worker, caller, idents, sched.outages)
        assert sched.lookup(caller, idents) == 2 and worker.counters.saved_blocks == 2

        live.restart_empty()
        with pytest.raises(BackendUnavailable):  # the scheduler's old connection is gone
            sched.lookup(caller, idents)
        time.sleep(0.3)  # retry_after_s
        assert sched.lookup(caller, idents) == 0  # so it plans both blocks again

        _save_step(worker, caller, idents, sched.outages)
        assert worker.counters.save_failures == 0
        assert worker.counters.saved_blocks == 4  # both written again, at once
        assert sched.lookup(caller, idents) == 2
    finally:
        worker.close()
        store.close()


def test_no_outage_keeps_the_workers_record_of_stored_blocks():
    store = ServiceBackend(("127.0.0.1", 1), timeout_s=0.1, retry_after_s=0.2)
    store._keys[("t", b"d")] = b"k"
    store.peer_outages(0)
    assert ("t", b"d") in store._keys  # nothing failed: no saves repeated
    store.peer_outages(1)
    assert not store._keys
    store._keys[("t", b"d")] = b"k"
    store.peer_outages(1)  # the same outage again: already forgotten once
    assert ("t", b"d") in store._keys
