"""A restore that fails in the step that computes the request: vLLM runs the forward
anyway, then rolls the request back to the first block not restored and recomputes from
there. The blocks that step computed read KV that was never restored: the worker used to
save them under their correct identities (served later, never rewritten, for the store
then held them). Now it drops that request's saves from the failed block on, and the
scheduler plans them again as vLLM recomputes them.

Also the scheduler's restore plan: a lookup that failed after an earlier one found a tail
kept that tail, so vLLM was told to expect tokens no load would fill, and planning the
loads then raised inside vLLM's scheduler."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentkv_cluster.engines.vllm.backend import BackendUnavailable, Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import EngineVersions, block_identity
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    AgentKVWorkerMeta,
    BlockOp,
    FailedLoad,
    RequestOps,
)
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.worker import WorkerSide

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
BS = 16


class MissingStore:
    """Holds nothing: every restore fails; records what is written."""

    name = "missing"

    def __init__(self) -> None:
        self.written: list[int] = []

    def get(self, caller, identity) -> None:
        return None

    def contains(self, caller, identity) -> bool:
        return False

    def put(self, caller, identity, data) -> None:
        self.written.append(identity.start)

    def close(self) -> None:
        return None


def _ident(index: int) -> object:
    return block_identity(VERSIONS, namespace="acme", adapter="", chain=bytes([index]) * 16,
                          index=index, block_size=BS)


@pytest.mark.parametrize("background", [False, True])
def test_a_request_whose_restore_failed_saves_nothing_its_step_computed(background):
    store = MissingStore()
    worker = WorkerSide(store, ConnectorCounters(), background=background)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.randn(8, 2, BS, 8)
                               for i in range(2)})
    caller = Caller(tenant="acme", session="s")
    meta = AgentKVConnectorMetadata(requests=[
        RequestOps("r", caller, loads=(BlockOp(_ident(0), 1), BlockOp(_ident(1), 2))),
        RequestOps("r", caller, saves=(BlockOp(_ident(2), 3),)),  # its step's new block
        RequestOps("other", caller, saves=(BlockOp(_ident(5), 6),))])
    worker.begin_step(meta)
    worker.finish_loads()
    worker.wait_for_save(meta)
    assert worker.flush(10.0)
    assert worker.take_load_errors() == {1, 2}
    # not r's block 2 (computed on blocks 0-1 unrestored), nor, this step, another
    # request's: it may have read blocks 1-2 too (a prefix-cache hit on them)
    assert store.written == []
    assert worker.take_failed_loads() == {"r": FailedLoad(tokens=2 * BS, step=1)}
    assert worker.take_skipped() == {"r": 2 * BS, "other": 5 * BS}  # planned again
    worker.close()


def _run(worker: WorkerSide, *requests: RequestOps, seen: int = 0) -> None:
    meta = AgentKVConnectorMetadata(requests=list(requests), failures_seen=seen)
    worker.begin_step(meta)
    worker.finish_loads()
    worker.wait_for_save(meta)
    assert worker.flush(10.0)


@pytest.mark.parametrize("background", [False, True])
def test_saves_planned_before_the_scheduler_read_a_failed_load_are_skipped(background):
    """Async scheduling (vLLM's default) plans step 2 while step 1 runs: step 2's saves of
    r were computed on step 1's blocks that never loaded, and so may be those of a request
    with a prefix-cache hit on them. Only the saves of a step planned once the scheduler
    had read step 1's report (``failures_seen``) are written; the skipped ones are
    reported (planned again) and the directory mirror stops matching them."""
    store = MissingStore()
    worker = WorkerSide(store, ConnectorCounters(), background=background)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.randn(8, 2, BS, 8)
                               for i in range(2)})
    caller = Caller(tenant="acme", session="s")
    _run(worker, RequestOps("r", caller, loads=(BlockOp(_ident(0), 1), BlockOp(_ident(1), 2)),
                            saves=(BlockOp(_ident(2), 3),)))
    report = worker.take_failed_loads()  # step 1's, which the scheduler reads after step 2
    assert report == {"r": FailedLoad(tokens=2 * BS, step=1)}
    _run(worker, RequestOps("r", caller, saves=(BlockOp(_ident(3), 4),)),
         RequestOps("other", caller, saves=(BlockOp(_ident(5), 6),)))
    assert store.written == []
    assert worker.take_skipped() == {"r": 2 * BS, "other": 5 * BS}
    assert {_ident(i).digest() for i in (2, 3, 5)} <= worker.take_dropped()
    recomputed = tuple(BlockOp(_ident(i), i + 1) for i in range(4))
    _run(worker, RequestOps("r", caller, saves=recomputed),
         RequestOps("other", caller, saves=(BlockOp(_ident(5), 6),)), seen=report["r"].step)
    assert store.written == [0, BS, 2 * BS, 3 * BS, 5 * BS]
    assert worker.take_skipped() == {}
    worker.close()


def test_worker_reports_merge_to_the_latest_failure():
    a = AgentKVWorkerMeta(failed_loads={"r": FailedLoad(tokens=2 * BS, step=3)},
                          skipped={"r": 3 * BS})
    b = AgentKVWorkerMeta(failed_loads={"r": FailedLoad(tokens=BS, step=5),
                                        "q": FailedLoad(tokens=BS, step=4)},
                          skipped={"r": 2 * BS, "q": BS})
    merged = a.aggregate(b)
    assert merged.failed_loads == {"r": FailedLoad(tokens=2 * BS, step=5),
                                   "q": FailedLoad(tokens=BS, step=4)}
    assert merged.skipped == {"r": 2 * BS, "q": BS}


def _scheduler() -> SchedulerSide:
    return SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                         ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                         async_load=False, min_tail_tokens=4)


def _request(req_id: str, tokens: int, session: str = "s") -> SimpleNamespace:
    ids = list(range(100, 100 + tokens))
    return SimpleNamespace(request_id=req_id, prompt_token_ids=list(ids), all_token_ids=ids,
                           output_token_ids=[], num_computed_tokens=0,
                           kv_transfer_params={"agentkv": {"session": session}})


def _blocks(ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(get_block_ids=lambda: (ids,))


def _step(new=(), cached=()) -> SimpleNamespace:
    """``new``/``cached``: (request, block ids, computed tokens); each computes the rest
    of its tokens."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, block_ids=(ids,),
                                            num_computed_tokens=c) for r, ids, c in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r.request_id for r, _, _ in cached], new_block_ids=[None] * len(cached),
            resumed_req_ids=set(), num_computed_tokens=[c for _, _, c in cached]),
        num_scheduled_tokens={r.request_id: len(r.all_token_ids) - c
                              for r, _, c in (*new, *cached)})


def _saved(meta) -> list[int]:
    return [op.identity.start // BS for req in meta.requests for op in req.saves]


def test_the_blocks_recomputed_after_a_failed_restore_are_saved_again():
    sched = _scheduler()
    writer = _request("w", 3 * BS + 1, session="t")
    sched.arrived(writer)
    assert sched.get_num_new_matched_tokens(writer, 0) == (0, False)
    assert _saved(sched.build_connector_meta(_step(new=[(writer, [0, 1, 2, 3], 0)]))) == [0, 1, 2]
    sched.request_finished(writer, [0, 1, 2, 3])
    req = _request("r", 4 * BS + 1)
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (3 * BS, False)
    sched.update_state_after_alloc(req, _blocks([4, 5, 6, 7, 8]), 3 * BS)
    meta = sched.build_connector_meta(_step(new=[(req, [4, 5, 6, 7, 8], 3 * BS)]))
    assert _saved(meta) == [3]  # dropped by the worker: blocks 1-2 did not load
    sched.load_failed({"r": FailedLoad(tokens=2 * BS, step=1)})
    # vLLM recomputes from block 1: its saves from there are planned again, marked as
    # planned knowing of the failure (the worker drops r's saves planned before)
    again = sched.build_connector_meta(_step(cached=[(req, [], BS)]))
    assert _saved(again) == [1, 2, 3]
    assert again.failures_seen == 1  # planned knowing of the failure: the worker saves
    assert sched.request_finished(req, [4, 5, 6, 7, 8])[1]["agentkv"]["restored_tokens"] == BS


def test_a_tail_found_by_an_earlier_lookup_is_dropped_when_the_lookup_fails(monkeypatch):
    sched = _scheduler()
    writer = _request("w", 2 * BS + 10, session="t")
    sched.arrived(writer)
    sched.get_num_new_matched_tokens(writer, 0)
    sched.build_connector_meta(_step(new=[(writer, [0, 1, 2], 0)]))
    writer.output_token_ids.append(7)  # stopped early: its tail (10 tokens) is saved
    writer.all_token_ids.append(7)
    writer.num_computed_tokens = 2 * BS + 10
    assert sched.request_finished(writer, [0, 1, 2])[0] is True
    req = _request("r", 2 * BS + 14)
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS + 10, False)  # blocks + tail

    def down(caller, identities):
        raise BackendUnavailable("store down")

    monkeypatch.setattr(sched.backend, "lookup", down)  # then vLLM asks again (preempted)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, _blocks([3, 4, 5]), 0)
    ops = sched.build_connector_meta(_step()).requests
    assert [o.req_id for o in ops] == ["w"]  # the writer's tail save: nothing to restore


def test_a_restore_that_cannot_be_planned_is_recomputed_not_raised():
    """An inconsistency in the scheduler's records (the stale tail above was one) reaches
    neither vLLM's scheduler nor a forward reading blocks nothing restored."""
    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                          async_load=True, min_tail_tokens=0)
    writer = _request("w", 2 * BS + 1, session="t")
    sched.arrived(writer)
    sched.get_num_new_matched_tokens(writer, 0)
    sched.build_connector_meta(_step(new=[(writer, [0, 1, 2], 0)]))
    req = _request("r", 2 * BS + 1)
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS, True)
    sched._reqs["r"].matched = []  # the records no longer cover what vLLM was told
    sched.update_state_after_alloc(req, _blocks([3, 4, 5]), 2 * BS)
    meta = sched.build_connector_meta(_step())
    assert [(o.unrestored, o.async_load) for o in meta.requests] == [((3, 4), True)]
    worker = WorkerSide(MissingStore(), ConnectorCounters(), background=False)
    worker.register_kv_caches({"model.layers.0.attn": torch.zeros(8, 2, BS, 8)})
    worker.begin_step(meta)
    assert worker.take_load_errors() == {3, 4}  # vLLM recomputes them ...
    assert worker.get_finished() == (None, {"r"})  # ... once the "load" is reported
    report = sched.request_finished(req, [3, 4, 5])[1]["agentkv"]
    assert report["restored_tokens"] == 0 and report["errors"]
    worker.close()


def test_skipped_saves_are_planned_again_and_a_sharer_of_a_failed_block_never_saved():
    """A request holding a block another request failed to load (vLLM adds a synchronous
    load's blocks to its prefix cache at allocation: a hit on them) computed on KV never
    restored: vLLM rolls it back, or under async scheduling may not. It is never saved
    again; a request that shares no failed block has its skipped saves planned again."""
    sched = _scheduler()
    a, b = _request("a", 2 * BS + 1, session="t"), _request("b", 3 * BS + 1, session="u")
    for req in (a, b):
        sched.arrived(req)
        sched.get_num_new_matched_tokens(req, 0)
    first = sched.build_connector_meta(_step(new=[(a, [0, 1, 2], 0), (b, [3, 4, 5, 6], 0)]))
    assert _saved(first) == [0, 1, 0, 1, 2]
    # the worker skipped them (a failed load it reported); block 4, b's, failed for "r"
    sched.load_failed({"r": FailedLoad(tokens=BS, step=3)})
    sched.saves_skipped({"a": 0, "b": 0}, invalid={4}, failed={"r"})
    again = sched.build_connector_meta(_step(cached=[(a, [], 2 * BS + 1), (b, [], 3 * BS + 1)]))
    assert [(o.req_id, o.saves[0].identity.start) for o in again.requests] == [("a", 0)]
    assert _saved(again) == [0, 1] and again.failures_seen == 3
    b.output_token_ids.append(7)  # b stopped early: its tail is not saved either
    assert sched.request_finished(b, [3, 4, 5, 6])[0] is False
