"""A request aborted while its asynchronous load runs: vLLM keeps its blocks itself until
the worker reports the load (``finished_recving``) and frees them then. The connector used
to keep them as well (``request_finished`` returned True) and queue a release the worker
reported in ``finished_sending``: the second report found the request gone and vLLM's
EngineCore died on its assert. Two cases did that: the request carrying its session's
``task_end`` (it carries the hint), and a preempted request reloading with a tail.

The scheduler side runs on stand-ins for vLLM's requests and step output; the worker side
on a stand-in store."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from agentkv_cluster.engines.vllm.backend import Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import EngineVersions, block_identity
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.hints import HintKind
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.worker import WorkerSide

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
BS = 16
END = {"kind": "task_end"}


def _scheduler(min_tail_tokens: int = 0) -> SchedulerSide:
    return SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                         ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                         async_load=True, min_tail_tokens=min_tail_tokens)


def _request(req_id: str, hints: dict, tokens: int) -> SimpleNamespace:
    ids = list(range(100, 100 + tokens))
    return SimpleNamespace(request_id=req_id, prompt_token_ids=list(ids), all_token_ids=ids,
                           output_token_ids=[], num_computed_tokens=0,
                           kv_transfer_params={"agentkv": hints})


def _blocks(ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(get_block_ids=lambda: (ids,))


def _step(*scheduled: tuple[SimpleNamespace, list[int], int]) -> SimpleNamespace:
    """A step that schedules these requests' prompts past ``computed`` tokens."""
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                             num_computed_tokens=[])
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, block_ids=(ids,),
                                            num_computed_tokens=c) for r, ids, c in scheduled],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={r.request_id: len(r.all_token_ids) - c for r, _, c in scheduled})


def _written(sched: SchedulerSide, req: SimpleNamespace, ids: list[int]) -> None:
    """``req`` ran its whole prompt and finished: its blocks are held."""
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, _blocks(ids), 0)
    sched.build_connector_meta(_step((req, ids, 0)))


def _kinds(meta) -> list[tuple[str, HintKind]]:
    return [(caller.session, event.kind) for caller, event in meta.events]


def test_the_request_carrying_the_task_end_aborted_while_loading_is_freed_once():
    sched = _scheduler()
    writer = _request("w", {"session": "other"}, 2 * BS + 1)
    _written(sched, writer, [0, 1, 2])
    assert sched.request_finished(writer, [0, 1, 2])[0] is False
    ending = _request("end", {"session": "s1", "events": [END]}, 2 * BS + 1)
    sched.arrived(ending)
    assert sched.get_num_new_matched_tokens(ending, 0) == (2 * BS, True)
    sched.update_state_after_alloc(ending, _blocks([3, 4, 5]), 2 * BS)
    meta = sched.build_connector_meta(_step())
    assert [(o.req_id, o.async_load) for o in meta.requests] == [("end", True)]
    # aborted in WAITING_FOR_REMOTE_KVS: vLLM holds the blocks until finished_recving
    delay, _ = sched.request_finished(ending, [3, 4, 5])
    assert delay is False  # (True made vLLM free it on both reports)
    ops = sched.build_connector_meta(_step()).requests
    assert [(o.req_id, o.release, o.barrier) for o in ops] == [("end", False, True)]
    assert sched.awaiting_barriers  # the engine keeps stepping for its report
    assert _kinds(sched.build_connector_meta(_step())) == []
    sched.released({"end"})  # the worker's metadata: every save queued before is written
    assert not sched.awaiting_barriers
    assert _kinds(sched.build_connector_meta(_step())) == [("s1", HintKind.TASK_END)]


def test_once_its_load_is_reported_the_carrier_is_released_as_before():
    sched = _scheduler()
    _written(sched, _request("w", {"session": "other"}, 2 * BS + 1), [0, 1, 2])
    ending = _request("end", {"session": "s1", "events": [END]}, 2 * BS + 1)
    sched.arrived(ending)
    sched.get_num_new_matched_tokens(ending, 0)
    sched.update_state_after_alloc(ending, _blocks([3, 4, 5]), 2 * BS)
    sched.build_connector_meta(_step())
    sched.loaded({"end"})  # finished_recving: vLLM no longer holds the blocks for the load
    assert sched.request_finished(ending, [3, 4, 5])[0] is True
    ops = sched.build_connector_meta(_step()).requests
    assert [(o.req_id, o.release, o.barrier) for o in ops] == [("end", True, True)]


def test_a_preempted_request_aborted_while_reloading_plans_no_tail():
    sched = _scheduler(min_tail_tokens=4)
    writer = _request("w", {"session": "t"}, 2 * BS + 10)
    _written(sched, writer, [0, 1, 2])
    writer.output_token_ids.append(7)  # stopped (a stop token): its tail is saved
    writer.all_token_ids.append(7)
    writer.num_computed_tokens = 2 * BS + 10
    assert sched.request_finished(writer, [0, 1, 2])[0] is True
    sched.build_connector_meta(_step())
    sched.released({"w"})
    req = _request("r", {"session": "s"}, 2 * BS + 14)  # repeats the writer's tokens
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS + 10, True)  # with the tail
    sched.update_state_after_alloc(req, _blocks([3, 4, 5]), 2 * BS + 10)
    sched.build_connector_meta(_step())
    sched.loaded({"r"})
    sched.build_connector_meta(_step((req, [3, 4, 5], 2 * BS + 10)))
    req.output_token_ids.append(9)  # it decoded, then vLLM preempted it
    req.all_token_ids.append(9)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS + 10, True)
    sched.update_state_after_alloc(req, _blocks([6, 7, 8]), 2 * BS + 10)
    sched.build_connector_meta(_step())
    req.num_computed_tokens = 2 * BS + 10  # as vLLM sets it for the load
    delay, _ = sched.request_finished(req, [6, 7, 8])  # aborted while reloading
    assert delay is False
    assert sched.build_connector_meta(_step()).requests == []


class SlowStore:
    """Writes wait for ``gate``."""

    name = "slow"

    def __init__(self) -> None:
        self.gate = threading.Event()

    def contains(self, caller, identity) -> bool:
        return False

    def put(self, caller, identity, data) -> None:
        self.gate.wait(10.0)

    def close(self) -> None:
        return None


@pytest.mark.parametrize("background", [True, False])
def test_the_worker_reports_a_barrier_without_a_release_only_in_its_metadata(background):
    store = SlowStore()
    if not background:  # writes on vLLM's thread: the barrier passes at once
        store.gate.set()
    worker = WorkerSide(store, ConnectorCounters(), background=background)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.zeros(4, 2, BS, 8)
                               for i in range(2)})
    caller = Caller(tenant="acme", session="s1")
    ident = block_identity(VERSIONS, namespace="acme", adapter="", chain=b"\x01" * 32,
                           index=0, block_size=BS)
    meta = AgentKVConnectorMetadata(requests=[
        RequestOps("other", caller, saves=(BlockOp(ident, 1),)),
        RequestOps("end", caller, barrier=True)])
    worker.begin_step(meta)
    worker.wait_for_save(meta)
    if background:
        assert worker.take_passed() == set()  # the save before it is not written yet
        store.gate.set()
        assert worker.flush(10.0)
    assert worker.take_passed() == {"end"}
    assert worker.get_finished() == (None, None)  # never a finished_sending
    worker.close()
