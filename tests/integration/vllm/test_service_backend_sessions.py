"""The connector's service backend serving many agent sessions: what it keeps per session
(client, started task, last tool call) is bounded by ``max_sessions``, least recently
used first, and the connection of an evicted session's token goes with its last session.
It used to keep every session and every token's connection for as long as vLLM ran. A
session that comes back after its eviction, or to a restarted engine, sends events the
service accepts (versions above any sent before); the service kept its pages meanwhile."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentkv_cluster.api.client import SessionClient
from agentkv_cluster.engines.vllm.backend import BackendUnavailable, ConnectorCounters
from agentkv_cluster.engines.vllm.config import ConnectorConfig, ConnectorConfigError
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.hintsock import HintSocket, send_hint
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.service import ServiceBackend
from agentkv_cluster.engines.vllm.sessions import DEFAULT_MAX_SESSIONS, SessionCache
from tests.integration.vllm.test_backend_contract import BS, TOKENS, VERSIONS, _ids, _page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc():
    with local_service("agentkv-vllm-sessions-", page_bytes=1 << 16, hbm_pages=64,
                       pool_bytes=4 << 20) as service:
        yield service


def _backend(svc, cap: int) -> ServiceBackend:
    return ServiceBackend(svc.address, timeout_s=5.0, retry_after_s=0.2, max_sessions=cap)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settles_at_most(limit: int, baseline: int) -> int:
    """Open descriptors above ``baseline`` once the server saw closed connections go."""
    deadline = time.monotonic() + 10.0
    while _open_fds() - baseline > limit and time.monotonic() < deadline:
        time.sleep(0.05)
    return _open_fds() - baseline


def test_sessions_and_connections_stay_within_the_cap(svc) -> None:
    """60 sessions, a token issued anew every 2 (short-lived tokens), cap 4: at most 4
    sessions and so 4 connections are kept (client and server end: 2 descriptors each);
    each evicted token's connection was closed. It used to keep 30 connections."""
    cap = 4
    backend = _backend(svc, cap)
    baseline = _open_fds()
    try:
        token = ""
        for i in range(60):
            if i % 2 == 0:
                token = svc.token("acme", subject=f"run{i}")
            caller = backend.resolve(token, f"agent-{i}")
            backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
        assert _settles_at_most(2 * cap, baseline) <= 2 * cap
        assert len(backend.sessions) == cap and backend.sessions.connections <= cap
        assert backend.sessions.evicted == 60 - cap
    finally:
        backend.close()


def test_an_evicted_session_comes_back_with_its_pages_and_events_accepted(svc) -> None:
    """Eviction drops only this engine's record: the service keeps the session's pages
    (an agent idle during a long tool call), and its next events are accepted."""
    backend = _backend(svc, 2)
    try:
        token = svc.token("acme")
        a = backend.resolve(token, "agent-idle")
        ident = _ids(TOKENS, "acme", 1)[0]
        backend.event(a, HintEvent(kind=HintKind.MODEL_CALL))
        backend.put(a, ident, _page(ident, 7))
        backend.event(a, HintEvent(kind=HintKind.TOOL_START, tool="build", call_id="c1"))
        for i in range(3):  # other sessions push it out
            other = backend.resolve(token, f"agent-busy-{i}")
            backend.event(other, HintEvent(kind=HintKind.MODEL_CALL))
        assert backend.sessions.get(token, "agent-idle") is None
        backend._keys.clear()  # what the engine knew of the block: found by lookup only
        a = backend.resolve(token, "agent-idle")
        backend.event(a, HintEvent(kind=HintKind.OBSERVATION_RETURN, call_id="c1"))
        backend.event(a, HintEvent(kind=HintKind.MODEL_CALL))
        assert backend.lookup(a, [ident]) == 1
        assert backend.get(a, ident) == _page(ident, 7)
    finally:
        backend.close()


def test_a_restarted_engine_continues_a_session_the_service_knows(svc) -> None:
    """A new engine process (a new backend) sends the session's next events: its versions
    are above the old engine's. Each engine used to count from 1 per session, so the
    service refused every event of a session it knew (version 1 after 3)."""
    token = svc.token("acme")
    first = _backend(svc, 8)
    try:
        caller = first.resolve(token, "agent-long")
        for _ in range(3):
            first.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
    finally:
        first.close()
    second = _backend(svc, 8)
    try:
        caller = second.resolve(token, "agent-long")
        second.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
        second.event(caller, HintEvent(kind=HintKind.TOOL_START, tool="grep"))
    finally:
        second.close()


def test_an_observation_return_without_call_id_pairs_with_the_sessions_tool_start(svc) -> None:
    """Its default call id is the session's last tool_start's, whatever events came between
    (it used to be the id the previous version would have had: a model call between, and
    the service refused it as an unknown tool call)."""
    backend = _backend(svc, 8)
    try:
        token = svc.token("acme")
        a = backend.resolve(token, "agent-tools")
        b = backend.resolve(token, "agent-other")
        backend.event(a, HintEvent(kind=HintKind.TOOL_START, tool="search"))
        backend.event(a, HintEvent(kind=HintKind.MODEL_CALL))
        backend.event(b, HintEvent(kind=HintKind.MODEL_CALL))
        backend.event(a, HintEvent(kind=HintKind.OBSERVATION_RETURN))
        with pytest.raises(ValueError, match="no tool_start of this session"):
            backend.event(b, HintEvent(kind=HintKind.OBSERVATION_RETURN))
        backend.event(b, HintEvent(kind=HintKind.MODEL_CALL))  # b's task goes on
    finally:
        backend.close()


class _FakeClient:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_connection_in_use_is_closed_only_when_its_call_ends() -> None:
    cache = SessionCache(1)
    conn_a, conn_b = _FakeClient(), _FakeClient()
    cache.add("tok-a", SessionClient(conn_a, "s1"))  # type: ignore[arg-type]
    lease = cache.lease("tok-a")
    _, unused = cache.add("tok-b", SessionClient(conn_b, "s2"))  # type: ignore[arg-type]
    assert unused == [] and cache.connection("tok-a") is None  # evicted, still in use
    assert cache.release(lease) == [conn_a]  # the call ended: now to close
    _, unused = cache.add("tok-b", SessionClient(conn_b, "s3"))  # type: ignore[arg-type]
    assert unused == []  # s2 evicted, but s3 still uses tok-b's connection
    assert cache.clear() == [conn_b] and len(cache) == 0


def test_the_cap_is_a_connector_setting() -> None:
    assert ConnectorConfig().service_max_sessions == DEFAULT_MAX_SESSIONS
    cfg = ConnectorConfig.from_extra({"backend": "service", "service_address": "h:1",
                                      "service_max_sessions": 64})
    assert cfg.service_max_sessions == 64
    for bad in (0, -1, "many", 2.5):
        with pytest.raises(ConnectorConfigError, match="service_max_sessions"):
            ConnectorConfig.from_extra({"service_max_sessions": bad})


def _finished_request(backend: ServiceBackend, hints: dict) -> SchedulerSide:
    """vLLM's scheduler admits a one-token request carrying ``hints``, which finishes."""
    sched = SchedulerSide(backend, VERSIONS, BS, ConnectorCounters(), remote=True,
                          lookup_timeout_s=30.0)
    request = SimpleNamespace(request_id="r1", prompt_token_ids=[1], all_token_ids=[1],
                              output_token_ids=[], num_computed_tokens=0,
                              kv_transfer_params={"agentkv": hints})
    while sched.get_num_new_matched_tokens(request, 0)[0] is None:
        time.sleep(0.01)
    _, report = sched.request_finished(request, [])
    assert report is not None and "errors" not in report["agentkv"], report
    return sched


def test_the_request_that_ends_the_task_closes_the_session_when_it_finishes(svc) -> None:
    """``task_end``: the agent session (one episode) is over. When the request carrying it
    finishes, the session is closed on the service: the pages only it held retire (a
    page another session holds stays), and the name starts afresh. The session used to
    stay open for good, its pages held, and its next task's events were refused."""
    backend = _backend(svc, 8)
    try:
        token = svc.token("acme")
        ended, other = backend.resolve(token, "episode-1"), backend.resolve(token, "episode-2")
        own, shared = _ids(list(range(3000, 3000 + 2 * BS)), "acme", 2)
        backend.event(ended, HintEvent(kind=HintKind.MODEL_CALL))
        backend.put(ended, own, _page(own, 1))
        backend.put(ended, shared, _page(shared, 2))
        backend.put(other, shared, _page(shared, 2))  # held by the other episode too
        sched = _finished_request(backend, {"session": "episode-1", "token": token,
                                            "events": [{"kind": "task_end"}]})
        sched.released({"r1"})  # the worker wrote its saves: vLLM freed its blocks
        sched._pool.shutdown(wait=True)  # the close runs on the lookup thread
        sched.close()
        assert backend.sessions.get(token, "episode-1") is None
        backend._keys.clear()
        assert backend.lookup(other, [own]) == 0  # retired with the episode
        assert backend.lookup(other, [shared]) == 1  # the other episode holds it still
        assert backend.get(other, shared) == _page(shared, 2)
        again = backend.resolve(token, "episode-1")  # a new episode of that name
        backend.event(again, HintEvent(kind=HintKind.MODEL_CALL))
    finally:
        backend.close()


def test_a_save_the_worker_writes_after_the_close_is_refused(svc) -> None:
    """The worker process still writing the last request's blocks when the scheduler
    closed the session: the save fails (a later miss), it does not open the session."""
    sched, worker = _backend(svc, 8), _backend(svc, 8)
    try:
        caller = sched.resolve(svc.token("acme"), "episode-6")
        first, late = _ids(list(range(6000, 6000 + 2 * BS)), "acme", 2)
        worker.put(caller, first, _page(first, 1))
        sched.event(caller, HintEvent(kind=HintKind.TASK_END))
        assert sched.end_session(caller)
        with pytest.raises(BackendUnavailable, match="not open"):
            worker.put(caller, late, _page(late, 2))
        assert worker.outages == 0  # a refusal, not a failed service
    finally:
        sched.close()
        worker.close()


def test_a_request_without_task_end_leaves_the_session_open(svc) -> None:
    backend = _backend(svc, 8)
    try:
        token = svc.token("acme")
        caller = backend.resolve(token, "episode-3")
        ident = _ids(list(range(5000, 5000 + BS)), "acme", 1)[0]
        backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
        backend.put(caller, ident, _page(ident, 3))
        sched = _finished_request(backend, {"session": "episode-3", "token": token,
                                            "events": [{"kind": "model_call"}]})
        sched._pool.shutdown(wait=True)
        sched.close()
        backend._keys.clear()
        assert backend.lookup(backend.resolve(token, "episode-4"), [ident]) == 1
    finally:
        backend.close()


def test_after_task_end_the_next_task_of_the_session_starts(svc) -> None:
    """Before its request finished (or where the close failed), the session's next event
    starts its task again; it was refused as naming an unknown task."""
    backend = _backend(svc, 8)
    try:
        caller = backend.resolve(svc.token("acme"), "episode-5")
        backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
        backend.event(caller, HintEvent(kind=HintKind.TASK_END))
        backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
    finally:
        backend.close()


def test_a_standalone_hint_reaches_the_service(svc, tmp_path: Path) -> None:
    """``hint_socket`` serves the service backend too: a ``tool_start`` sent on its own
    while the tool runs is applied on the service (off vLLM's scheduler thread), so the
    observation that returns pairs with it. Without it the service refuses the return
    as naming no tool call."""
    backend = _backend(svc, 8)
    path = str(tmp_path / "hints.sock")
    sched = SchedulerSide(backend, VERSIONS, BS, ConnectorCounters(), remote=True,
                          lookup_timeout_s=30.0, hints=HintSocket(path))
    try:
        token = svc.token("acme")
        caller = backend.resolve(token, "agent-socket")
        backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
        send_hint(path, {"session": "agent-socket", "token": token,
                         "events": [{"kind": "tool_start", "tool": "search"}]})
        step = SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
            num_scheduled_tokens={})
        sched.build_connector_meta(step)
        sched._pool.submit(lambda: None).result(timeout=30.0)  # the hint's turn is done
        assert (sched.counters.hints_received, sched.counters.hint_errors) == (1, 0)
        backend.event(caller, HintEvent(kind=HintKind.OBSERVATION_RETURN))
    finally:
        sched.close()
        backend.close()
