"""When the vLLM connector's embedded store applies ``task_end`` and ``branch_abandoned``:
only once no request of the session is in flight (running, waiting in vLLM's queue, or
finished with saves not written yet). The scheduler side runs on stand-ins for vLLM's
requests and step output; the end-to-end case runs the worker side on the real store.

Such an event used to reach the store one step after it arrived (held only while the
session loaded in that step), so a request of the session still waiting found its
prefix retired (recomputed) and saves still queued landed after the retire (kept)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import EngineVersions
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.hintsock import HintSocket, send_hint
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.worker import WorkerSide
from store.page import HEADER_SIZE

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
BS, LAYERS = 16, 2
END = {"kind": "task_end"}


def _scheduler(hints: HintSocket | None = None) -> SchedulerSide:
    return SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                         ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                         min_tail_tokens=0, hints=hints)


def _request(req_id: str, hints: dict, tokens: int = BS + 1, first: int = 0
             ) -> SimpleNamespace:
    ids = list(range(100 + first, 100 + first + tokens))
    return SimpleNamespace(request_id=req_id, prompt_token_ids=ids, all_token_ids=ids,
                           output_token_ids=[], num_computed_tokens=0,
                           kv_transfer_params={"agentkv": hints})


def _admitted(sched: SchedulerSide, *requests) -> None:
    """vLLM took them (``on_new_request``) and looked them up (admission, events)."""
    for r in requests:
        sched.arrived(r)
        assert sched.get_num_new_matched_tokens(r, 0) == (0, False)


def _step(*scheduled: tuple[SimpleNamespace, list[int]]) -> SimpleNamespace:
    """A step that schedules these requests' whole prompts into those vLLM blocks."""
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                             num_computed_tokens=[])
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, block_ids=(ids,),
                                            num_computed_tokens=0) for r, ids in scheduled],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={r.request_id: len(r.all_token_ids) for r, _ in scheduled})


def _kinds(meta) -> list[tuple[str, HintKind]]:
    return [(caller.session, event.kind) for caller, event in meta.events]


def test_a_task_end_waits_for_a_request_of_its_session_in_vllms_queue():
    sched = _scheduler()
    ending = _request("end", {"session": "s", "events": [END]})
    queued = _request("queued", {"session": "s"}, tokens=2 * BS + 1)  # the same prefix
    _admitted(sched, ending)
    sched.arrived(queued)  # waiting for room: not looked up yet
    assert _kinds(sched.build_connector_meta(_step((ending, [0, 1])))) == []
    assert sched.request_finished(ending, [0, 1])[0] is False
    assert _kinds(sched.build_connector_meta(_step())) == []
    assert sched.get_num_new_matched_tokens(queued, 0) == (BS, True)  # still held
    sched.update_state_after_alloc(queued, SimpleNamespace(get_block_ids=lambda: ([2, 3, 4],)),
                                   BS)
    meta = sched.build_connector_meta(_step())
    assert [len(o.loads) for o in meta.requests] == [1] and _kinds(meta) == []
    sched.loaded({"queued"})  # finished_recving: then it runs, and finishes
    delay, _ = sched.request_finished(queued, [2, 3, 4])
    assert delay is True  # the last one carries the task_end: vLLM keeps its blocks ...
    ops = sched.build_connector_meta(_step()).requests
    assert [(o.req_id, o.release, o.barrier) for o in ops] == [("queued", True, True)]
    assert sched.closes.held == 1  # ... until the worker wrote every save before it
    sched.released({"queued"})
    assert _kinds(sched.build_connector_meta(_step())) == [("s", HintKind.TASK_END)]
    assert sched.closes.held == 0


def test_a_branch_abandoned_waits_for_the_sessions_running_requests():
    sched = _scheduler()
    running = _request("run", {"session": "s", "branch": "main"})
    abandon = _request("ab", {"session": "s", "branch": "try-2", "events": [
        {"kind": "branch_abandoned", "branch": "try-2"}]}, first=50)
    other = _request("other", {"session": "t", "events": [END]}, first=90)
    _admitted(sched, running, abandon, other)
    meta = sched.build_connector_meta(_step((running, [0, 1]), (abandon, [2, 3])))
    assert _kinds(meta) == []  # the other session's task_end waits for its own request
    sched.request_finished(abandon, [2, 3])
    sched.request_finished(other, [])
    sched.build_connector_meta(_step())
    sched.released({"other"})
    assert _kinds(sched.build_connector_meta(_step())) == [("t", HintKind.TASK_END)]
    assert sched.request_finished(running, [0, 1])[0] is True
    sched.build_connector_meta(_step())
    sched.released({"run"})
    assert _kinds(sched.build_connector_meta(_step())) == [("s", HintKind.BRANCH_ABANDONED)]


def test_a_request_arriving_before_the_hint_goes_out_holds_it_again():
    sched = _scheduler()
    ending = _request("end", {"session": "s", "events": [END]})
    _admitted(sched, ending)
    sched.build_connector_meta(_step((ending, [0, 1])))
    assert sched.request_finished(ending, [0, 1])[0] is True
    sched.build_connector_meta(_step())
    sched.released({"end"})
    late = _request("late", {"session": "s"}, first=50)
    sched.arrived(late)  # between the release and the next step
    assert _kinds(sched.build_connector_meta(_step())) == []
    _admitted(sched, late)
    sched.build_connector_meta(_step((late, [2, 3])))
    assert sched.request_finished(late, [2, 3])[0] is True  # now it carries the hint
    sched.build_connector_meta(_step())
    sched.released({"late"})
    assert _kinds(sched.build_connector_meta(_step())) == [("s", HintKind.TASK_END)]


def test_a_new_episode_drops_the_waiting_task_end():
    sched = _scheduler()
    ending = _request("end", {"session": "s", "events": [END]})
    running = _request("run", {"session": "s"}, first=50)
    _admitted(sched, ending, running)
    sched.build_connector_meta(_step((ending, [0, 1]), (running, [2, 3])))
    sched.request_finished(ending, [0, 1])
    again = _request("next", {"session": "s", "events": [{"kind": "task_start"}]}, first=90)
    _admitted(sched, again)  # the blocks it may restore are the old episode's
    assert _kinds(sched.build_connector_meta(_step())) == [("s", HintKind.TASK_START)]
    assert sched.closes.held == 0
    sched.request_finished(running, [2, 3])
    sched.request_finished(again, [])
    sched.released({"run", "next"})
    assert _kinds(sched.build_connector_meta(_step())) == []


def test_a_task_end_sent_on_its_own_waits_for_the_sessions_requests(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    sched = _scheduler(HintSocket(path))
    try:
        running = _request("run", {"session": "s"})
        _admitted(sched, running)
        sched.build_connector_meta(_step((running, [0, 1])))
        send_hint(path, {"session": "s", "events": [END]})
        send_hint(path, {"session": "idle", "events": [END]})  # nothing in flight: at once
        assert _kinds(sched.build_connector_meta(_step())) == [("idle", HintKind.TASK_END)]
        assert sched.request_finished(running, [0, 1])[0] is True
        sched.build_connector_meta(_step())
        sched.released({"run"})
        assert _kinds(sched.build_connector_meta(_step())) == [("s", HintKind.TASK_END)]
    finally:
        sched.close()


def test_the_task_end_retires_the_blocks_of_saves_still_queued_when_it_arrived():
    """Scheduler and worker on the real store, saves written on the worker's thread: the
    session's blocks are all gone after its task_end, none landed after it."""
    page = HEADER_SIZE + LAYERS * 3 * BS * 8 * 4
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=page, host_blocks=8, nvme_blocks=0))
    worker = WorkerSide(store, ConnectorCounters(), background=True)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.randn(8, 3, BS, 8)
                               for i in range(LAYERS)})
    sched = _scheduler()
    ending = _request("end", {"session": "s", "events": [END]})
    running = _request("run", {"session": "s"}, tokens=2 * BS + 1, first=50)
    try:
        _admitted(sched, ending, running)
        meta = sched.build_connector_meta(_step((ending, [0, 1]), (running, [2, 3, 4])))
        worker.begin_step(meta)
        worker.wait_for_save(meta)  # three saves queued on the worker's thread
        sched.request_finished(ending, [0, 1])
        meta = sched.build_connector_meta(_step())
        worker.begin_step(meta)
        assert sched.request_finished(running, [2, 3, 4])[0] is True
        meta = sched.build_connector_meta(_step())
        worker.begin_step(meta)
        worker.wait_for_save(meta)
        assert worker.flush(10.0)
        sent, _ = worker.get_finished()
        assert sent == {"run"}
        assert store.stats()["blocks"] == 3  # every save written, none retired yet
        sched.released(sent)
        meta = sched.build_connector_meta(_step())
        assert _kinds(meta) == [("s", HintKind.TASK_END)]
        worker.begin_step(meta)
        assert store.stats()["blocks"] == 0
    finally:
        sched.close()
        worker.close()
        store.close()


def test_another_sessions_restore_in_the_step_a_task_end_arrives_keeps_its_blocks(
        tmp_path: Path):
    """Session t restores the prefix only session s wrote, in the step s's task_end goes
    out: t reads those blocks from then on, so they stay (the retire used to drop them
    before t's loads read them: "could not be restored; recomputed")."""
    page = HEADER_SIZE + LAYERS * 3 * BS * 8 * 4
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=page, host_blocks=8, nvme_blocks=0))
    kv = {f"model.layers.{i}.attn": torch.randn(8, 3, BS, 8) for i in range(LAYERS)}
    worker = WorkerSide(store, ConnectorCounters(), background=False)
    worker.register_kv_caches(kv)
    path = str(tmp_path / "h.sock")
    sched = _scheduler(HintSocket(path))
    writer = _request("w", {"session": "s"}, tokens=2 * BS + 1)
    reader = _request("r", {"session": "t"}, tokens=2 * BS + 1)
    try:
        _admitted(sched, writer)
        meta = sched.build_connector_meta(_step((writer, [0, 1, 2])))
        worker.begin_step(meta)
        worker.wait_for_save(meta)
        assert sched.request_finished(writer, [0, 1, 2])[0] is False
        assert store.stats()["blocks"] == 2
        send_hint(path, {"session": "s", "events": [END]})  # nothing of s in flight
        sched.arrived(reader)
        assert sched.get_num_new_matched_tokens(reader, 0) == (2 * BS, True)
        sched.update_state_after_alloc(
            reader, SimpleNamespace(get_block_ids=lambda: ([5, 6, 7],)), 2 * BS)
        meta = sched.build_connector_meta(_step())
        assert _kinds(meta) == [("s", HintKind.TASK_END)]
        worker.begin_step(meta)
        assert worker.take_failed_loads() == {}
        assert worker.get_finished() == (None, {"r"})
        assert all(torch.equal(layer[5], layer[0]) and torch.equal(layer[6], layer[1])
                   for layer in kv.values())
        assert store.stats()["blocks"] == 2  # t's now; its own task_end retires them
        store.event(TokenResolver(None, "acme").resolve(None, "t"),
                    HintEvent(kind=HintKind.TASK_END))
        assert store.stats()["blocks"] == 0
    finally:
        sched.close()
        worker.close()
        store.close()


def _store_and_worker():
    page = HEADER_SIZE + LAYERS * 3 * BS * 8 * 4
    store = EmbeddedBackend(EmbeddedSpec(slot_bytes=page, host_blocks=8, nvme_blocks=0))
    worker = WorkerSide(store, ConnectorCounters(), background=False)
    worker.register_kv_caches({f"model.layers.{i}.attn": torch.randn(8, 3, BS, 8)
                               for i in range(LAYERS)})
    return store, worker


def _run(worker, meta) -> None:
    worker.begin_step(meta)
    worker.wait_for_save(meta)


def _end(store, session: str) -> None:
    store.event(TokenResolver(None, "acme").resolve(None, session),
                HintEvent(kind=HintKind.TASK_END))


def test_a_prefix_two_sessions_compute_in_one_step_outlives_one_of_them():
    """Both save the same blocks: the second finds them held (written by the first) and
    is a reader of them too, so the first session's task_end keeps them."""
    store, worker = _store_and_worker()
    sched = _scheduler()
    one = _request("one", {"session": "s"}, tokens=2 * BS + 1)
    two = _request("two", {"session": "t"}, tokens=2 * BS + 1)
    try:
        _admitted(sched, one, two)
        _run(worker, sched.build_connector_meta(_step((one, [0, 1, 2]), (two, [3, 4, 5]))))
        assert store.stats()["blocks"] == 2
        _end(store, "s")
        assert store.stats()["blocks"] == 2  # t's still
        _end(store, "t")
        assert store.stats()["blocks"] == 0
    finally:
        sched.close()
        worker.close()
        store.close()


@pytest.mark.parametrize("past_hit", [1, 0])
def test_a_prefix_served_from_vllms_own_cache_outlives_the_session_that_wrote_it(past_hit):
    """Session t's request finds the shared prefix in vLLM's own prefix cache (nothing to
    restore) while the store holds it from session s: t is a reader of those blocks. Its
    prompt goes on for ``past_hit`` blocks past the hit (looked up), or is the same prompt
    (vLLM's cache holds all of it: no lookup is needed)."""
    store, worker = _store_and_worker()
    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0)
    writer = _request("w", {"session": "s"}, tokens=2 * BS + 1)
    reader = _request("r", {"session": "t"}, tokens=(2 + past_hit) * BS + 1)
    blocks = [0, 1, 3, 4][:3 + past_hit]
    try:
        _admitted(sched, writer)
        _run(worker, sched.build_connector_meta(_step((writer, [0, 1, 2]))))
        sched.request_finished(writer, [0, 1, 2])
        sched.arrived(reader)
        assert sched.get_num_new_matched_tokens(reader, 2 * BS) == (0, False)  # vLLM's hit
        sched.update_state_after_alloc(reader, SimpleNamespace(get_block_ids=lambda: (blocks,)),
                                       0)
        step = _step((reader, blocks))
        step.scheduled_new_reqs[0].num_computed_tokens = 2 * BS
        step.num_scheduled_tokens["r"] = past_hit * BS + 1
        _run(worker, sched.build_connector_meta(step))
        assert store.stats()["blocks"] == 2 + past_hit  # its own full blocks saved
        _end(store, "s")
        assert store.stats()["blocks"] == 2 + past_hit  # the prefix t uses stays
        _end(store, "t")
        assert store.stats()["blocks"] == 0
    finally:
        sched.close()
        worker.close()
        store.close()


def test_a_claim_on_another_tenants_block_changes_nothing():
    store, worker = _store_and_worker()
    sched = _scheduler()
    one = _request("one", {"session": "s"}, tokens=2 * BS + 1)
    try:
        _admitted(sched, one)
        meta = sched.build_connector_meta(_step((one, [0, 1, 2])))
        _run(worker, meta)
        idents = [op.identity for op in meta.requests[0].saves]
        store.claim(TokenResolver(None, "globex").resolve(None, "s"), idents)
        _end(store, "s")
        assert store.stats()["blocks"] == 0  # acme's s was their only reader
    finally:
        sched.close()
        worker.close()
        store.close()
