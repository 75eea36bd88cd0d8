"""When the vLLM connector closes an agent session on the service after ``task_end``, and
what happens to closes still queued when the engine shuts down. No engine, no service:
the scheduler side runs on stand-ins for vLLM's requests and for the service backend.

The close used to be sent as soon as the request carrying ``task_end`` finished, while
other requests of the session were still running or waiting (their saves were then
refused), and a close still queued at shutdown was cancelled (the service kept the
session)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import torch

from agentkv_cluster.engines.vllm.backend import Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import BlockGeometry, EngineVersions, block_identity
from agentkv_cluster.engines.vllm.hints import parse_hints
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.retiring import SessionCloses
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.worker import WorkerSide

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
END = {"kind": "task_end"}


class FakeService:
    """The parts of ``ServiceBackend`` the scheduler side calls; records the closes."""

    name = "service"
    outages = 0

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.closed: list[str] = []
        self.gate = gate  # set: calls proceed; unset: end_session waits for it

    def resolve(self, token, session):
        return Caller(tenant="acme", session=session or "vllm", token=token or "tok")

    def event(self, caller, event) -> None:
        return None

    def end_session(self, caller) -> bool:
        if self.gate is not None:
            self.gate.wait()
        self.closed.append(caller.session)
        return True

    def close(self) -> None:
        return None


def _request(req_id: str, hints: dict) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, prompt_token_ids=[1], all_token_ids=[1],
                           output_token_ids=[], num_computed_tokens=0,
                           kv_transfer_params={"agentkv": hints})


def _admitted(sched: SchedulerSide, *requests) -> None:
    for r in requests:
        sched.arrived(r)
        while sched.get_num_new_matched_tokens(r, 0)[0] is None:
            time.sleep(0.01)
    sched._pool.submit(lambda: None).result()  # admissions done


def _drain(sched: SchedulerSide) -> None:
    sched._pool.submit(lambda: None).result()


def _scheduler(backend: FakeService) -> SchedulerSide:
    return SchedulerSide(backend, VERSIONS, 16, ConnectorCounters(), remote=True,
                         lookup_timeout_s=30.0)


def test_the_close_waits_for_the_sessions_requests_in_flight():
    backend = FakeService()
    sched = _scheduler(backend)
    ending = _request("end", {"session": "s1", "token": "tok", "events": [END]})
    running = _request("run", {"session": "s1", "token": "tok"})
    _admitted(sched, ending, running)
    delay, _ = sched.request_finished(ending, [])
    assert delay is False  # another request of the session is still in flight
    sched.released({"end"})
    _drain(sched)
    assert backend.closed == []  # the running request would lose its saves
    delay, _ = sched.request_finished(running, [])
    assert delay is True  # it carries the close: vLLM keeps its blocks until ...
    ops = sched.build_connector_meta(_empty_step()).requests
    assert [(o.req_id, o.release, o.barrier) for o in ops] == [("run", True, True)]
    _drain(sched)
    assert backend.closed == []  # ... the worker wrote every save queued before it
    sched.released({"run"})
    _drain(sched)
    assert backend.closed == ["s1"]
    sched.close()


def test_a_request_waiting_in_vllms_queue_holds_the_close_back():
    """Arrived (``on_new_request``) but never scheduled yet: in flight all the same."""
    backend = FakeService()
    sched = _scheduler(backend)
    ending = _request("end", {"session": "s1", "token": "tok", "events": [END]})
    _admitted(sched, ending)
    sched.arrived(_request("queued", {"session": "s1", "token": "tok"}))
    assert sched.request_finished(ending, [])[0] is False
    assert sched.closes.ledger.in_flight(("tok", "s1")) == 1
    sched.close(timeout_s=5.0)  # at shutdown it is sent all the same
    assert backend.closed == ["s1"]


def test_a_new_episode_before_the_close_keeps_the_session():
    backend = FakeService()
    sched = _scheduler(backend)
    ending = _request("end", {"session": "s1", "token": "tok", "events": [END]})
    _admitted(sched, ending)
    assert sched.request_finished(ending, [])[0] is True
    sched.build_connector_meta(_empty_step())
    again = _request("next", {"session": "s1", "token": "tok",
                              "events": [{"kind": "task_start"}]})
    _admitted(sched, again)
    sched.released({"end"})
    sched.request_finished(again, [])
    sched.close(timeout_s=5.0)
    assert backend.closed == []


def test_the_ledger_alone():
    closes, key = SessionCloses(), ("", "s")
    b, c, d = (SimpleNamespace(caller=None) for _ in range(3))
    closes.arrived(key, parse_hints({"agentkv": {"session": "s", "events": [END]}}))
    closes.arrived(key, parse_hints({"agentkv": {"session": "s"}}))
    assert closes.finished("b", key, b) is False
    closes.arrived(key, parse_hints({"agentkv": {"session": "s"}}))  # arrives meanwhile
    assert closes.finished("c", key, c) is False
    assert closes.finished("d", key, d) is True  # the last one carries it
    assert closes.waiting == 1
    assert closes.released({"b", "c", "d"}) == {key: d}
    assert closes.waiting == 0 and closes.drain() == []
    closes.arrived(key, parse_hints({"agentkv": {"session": "s", "events": [END]}}))
    closes.arrived(key, parse_hints({"agentkv": {"session": "s", "events": [
        {"kind": "task_start"}]}}))  # a new episode of the name: no close
    assert closes.finished("e", key, b) is False and closes.finished("f", key, c) is False
    assert closes.waiting == 0


def test_a_close_queued_at_shutdown_is_sent():
    """Behind a lookup still running on the lookup thread when the engine stops."""
    gate = threading.Event()
    backend = FakeService()
    sched = _scheduler(backend)
    ending = _request("end", {"session": "s1", "token": "tok", "events": [END]})
    _admitted(sched, ending)
    assert sched.request_finished(ending, [])[0] is True
    sched._pool.submit(gate.wait, 5.0)  # a slow lookup ahead of the close
    sched.released({"end"})
    threading.Timer(0.2, gate.set).start()
    sched.close(timeout_s=10.0)
    assert backend.closed == ["s1"]


def test_a_close_the_service_never_answers_gives_up_with_a_log_line(caplog):
    gate = threading.Event()
    sched = _scheduler(FakeService(gate))
    ending = _request("end", {"session": "s1", "token": "tok", "events": [END]})
    _admitted(sched, ending)
    sched.request_finished(ending, [])
    with caplog.at_level(logging.WARNING, "agentkv_cluster.engines.vllm.retiring"):
        sched.close(timeout_s=0.2)
    gate.set()
    assert any("1 session closes not sent" in r.getMessage() for r in caplog.records)


def _empty_step():
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                             num_computed_tokens=[])
    return SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                           num_scheduled_tokens={})


class SlowStore:
    """A block backend whose writes wait for ``gate``."""

    name = "slow"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.written: list[int] = []

    def contains(self, caller, identity) -> bool:
        return False

    def put(self, caller, identity, data) -> None:
        self.gate.wait(10.0)
        self.written.append(identity.start)

    def close(self) -> None:
        return None


def test_the_worker_releases_a_barrier_only_after_the_saves_before_it():
    store = SlowStore()
    worker = WorkerSide(store, ConnectorCounters(), background=True)
    kv = {f"model.layers.{i}.attn": torch.zeros(4, 2, 16, 8) for i in range(2)}
    worker.register_kv_caches(kv)
    assert isinstance(worker.geometry, BlockGeometry)
    caller = Caller(tenant="acme", session="s1")
    ident = block_identity(VERSIONS, namespace="acme", adapter="", chain=b"\x01" * 32,
                           index=0, block_size=16)
    meta = AgentKVConnectorMetadata(requests=[
        RequestOps("other", caller, saves=(BlockOp(ident, 1),)),
        RequestOps("tail", caller, release=True),
        RequestOps("carrier", caller, release=True, barrier=True)])
    worker.wait_for_save(meta)
    assert worker.get_finished() == ({"tail"}, None)  # copied out: freed at once
    assert worker.get_finished() == (None, None)  # the carrier waits for the write
    store.gate.set()
    assert worker.flush(10.0)
    assert store.written == [0]
    assert worker.get_finished() == ({"carrier"}, None)
    worker.close()
