"""Closing a session in the controller's bookkeeping (pure: no Ray, no bytes): its pages go
as its task's end would retire them, every record of it is forgotten, closing is
idempotent and tenant-scoped, and a load of it in flight ends instead of hanging."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from agentkv_cluster.lifecycle.types import SessionKey, StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.event_planner import SessionClosed
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.loads import EngineLoader
from agentkv_cluster.runtime.records import (
    ActionKind,
    Outcome,
    PageMeta,
    Reason,
    RefusedNotFound,
    TenantErased,
    TransferResult,
    UnknownPageKey,
    UnknownSession,
)
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, meta
from tests.unit.service.test_load_arrivals import _prefetching, _Worker


def _meta(tenant: str, session: str, pid: int, key: bytes | None = None,
          kind: StateType = StateType.EVIDENCE) -> PageMeta:
    return PageMeta(key=key or f"{tenant}/{session}/{pid}".encode(), digest=b"d" * 32,
                    tenant=tenant, namespace=tenant, session=session, page_id=pid,
                    state_type=kind, length=MB, tokens=16)


def _store(ctl: Controller, tenant: str, session: str, metas: list[PageMeta]) -> list[int]:
    ctl.table.open_session(tenant, session)
    out, _ = ctl.admit(tenant, session, metas, 0.0)
    ctl.ingested([g for g, _ in out])
    return [g for g, _ in out]


def _event(ctl: Controller, tenant: str, session: str, version: int, **data: object) -> list:
    event = ctl.events.translate(tenant, session, {"event_id": version, "task_id": "x",
                                                   "version": version, "ts": 0.1 * version,
                                                   **data})
    return ctl.apply(event, 0.1 * version)


def _controller() -> Controller:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 16 * MB)
    return ctl


def _in_a_tool_call(ctl: Controller, tenant: str = "t", session: str = "a") -> list[int]:
    """A task that read a prefix and an input page, produced a verified result, and is in
    a tool call; one page of it pinned by a load never released."""
    gids = _store(ctl, tenant, session, [_meta(tenant, session, p) for p in range(4)])
    _event(ctl, tenant, session, 1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, tenant, session, 2, kind="model_call", call_id="m1", consumes=[1],
           produces=[[2, "temp_reasoning"]])
    _event(ctl, tenant, session, 3, kind="verification_pass", call_id="v1", pages=[2])
    _event(ctl, tenant, session, 4, kind="tool_start", call_id="k1", tool="grep")
    ctl.access(gids[1:2], 0.5)
    ctl.table.hold(tenant, session, gids[1:2], 0.5)
    return gids


def test_closing_forgets_every_record_of_the_session() -> None:
    ctl = _controller()
    gids = _in_a_tool_call(ctl)
    closed, deletions = ctl.events.close_session("t", "a", 1.0)
    assert closed == SessionClosed(closed=True, tasks=1, retired=4, kept=0, pins=1,
                                   cancelled=closed.cancelled)
    assert sorted(a.gid for a in deletions) == gids
    assert all(a.kind is ActionKind.DELETE and a.reason is Reason.RETIRE for a in deletions)
    table, graph = ctl.table, ctl.events.graph
    assert table.sessions == {} and table.pages == {} and len(table.by_pid) == 0
    assert table.hbms["h"].sessions == 0 and table.hbms["h"].used == 0
    assert graph.page_ids() == frozenset() and graph.stats().tasks == 0
    assert graph.last_version("t", "a") is None
    assert ctl.strategy._last_tool == {}
    assert not any(a.gid in gids for _, a in ctl.schedule)


def test_an_audited_page_leaves_the_summary_its_tasks_end_would_write() -> None:
    ended, closed = _controller(), _controller()
    _in_a_tool_call(ended)
    _event(ended, "t", "a", 5, kind="observation_return", call_id="k1")
    _event(ended, "t", "a", 6, kind="task_end")
    _in_a_tool_call(closed)
    closed.events.close_session("t", "a", 0.1 * 6)  # ``retired_at``: the same instant
    by_end, by_close = ended.events.drain_audit(), closed.events.drain_audit()
    assert [s.state_type for s in by_close] == [StateType.VERIFIED_RESULT]
    assert [s.record() for s in by_close] == [s.record() for s in by_end]


def test_a_page_another_session_holds_stays_and_only_this_hold_goes() -> None:
    ctl = _controller()
    (shared,) = _store(ctl, "t", "a", [_meta("t", "a", 0, key=b"same")])
    assert _store(ctl, "t", "b", [_meta("t", "b", 7, key=b"same")]) == [shared]
    _event(ctl, "t", "a", 1, kind="task_start", prefix_generation=1, prefix_pages=[0])
    closed, deletions = ctl.events.close_session("t", "a", 1.0)
    assert (closed.retired, closed.kept, deletions) == (0, 1, [])
    assert ctl.table.resolve("t", "b", [b"same"]) == [shared]
    assert ctl.table.by_pid.holders(shared) == {("t", "b")}
    closed, deletions = ctl.events.close_session("t", "b", 2.0)  # the last holder
    assert (closed.retired, [a.gid for a in deletions]) == (1, [shared])
    assert ctl.table.pages == {} and ctl.events.graph.page_ids() == frozenset()


def test_a_public_page_stays_when_the_session_that_held_it_closes() -> None:
    ctl = _controller()
    public = PageMeta(key=b"pub", digest=b"p" * 32, tenant="t", namespace="public",
                      session="a", page_id=0, state_type=StateType.FIXED_PREFIX, length=MB,
                      tokens=16)
    (gid,) = _store(ctl, "t", "a", [public])
    closed, deletions = ctl.events.close_session("t", "a", 1.0)
    assert (closed.retired, closed.kept, deletions) == (0, 1, [])  # every tenant's page
    assert list(ctl.table.pages) == [gid] and len(ctl.table.by_pid) == 0


def test_closing_again_or_a_session_never_opened_answers_not_closed() -> None:
    ctl = _controller()
    _in_a_tool_call(ctl)
    assert ctl.events.close_session("t", "a", 1.0)[0].closed
    assert ctl.events.close_session("t", "a", 1.1) == (SessionClosed(closed=False), [])
    assert ctl.events.close_session("t", "never", 1.2) == (SessionClosed(closed=False), [])
    with pytest.raises(UnknownSession):
        ctl.table.resolve("t", "a", [b"t/a/1"])


def test_a_session_opened_again_after_its_close_starts_afresh() -> None:
    ctl = _controller()
    _in_a_tool_call(ctl)
    _, deletions = ctl.events.close_session("t", "a", 1.0)
    for a in deletions:  # ran: the same keys may be stored again (``Controller.admit``)
        ctl.finished(TransferResult(action=a, outcome=Outcome.DONE), 1.0)
    gids = _in_a_tool_call(ctl)  # the same task id, page ids and versions from 1 again
    assert ctl.table.sessions[("t", "a")].pages == set(gids)


def test_closing_never_touches_another_tenants_session_of_the_same_name() -> None:
    ctl = _controller()
    _in_a_tool_call(ctl, "t1", "main")
    theirs = _in_a_tool_call(ctl, "t2", "main")
    ctl.events.close_session("t1", "main", 1.0)
    assert set(ctl.table.pages) == set(theirs)
    assert list(ctl.table.sessions) == [("t2", "main")]
    assert ctl.table.resolve("t2", "main", [b"t2/main/1"]) == theirs[1:2]
    assert ctl.events.graph.last_version("t2", "main") == 4
    assert ctl.strategy._last_tool == {("t2", "main"): "grep"}


def test_a_session_of_a_tenant_being_erased_is_not_closed() -> None:
    ctl = _controller()
    _in_a_tool_call(ctl)
    ctl.table.begin_erase("t")
    with pytest.raises(TenantErased):
        ctl.events.close_session("t", "a", 1.0)


def test_a_load_waiting_on_a_page_of_a_closed_session_ends_not_found() -> None:
    ctl = Guarded(_controller())
    gids = _store(ctl.manager, "t", "a", [_meta("t", "a", 0)])
    rec = ctl.manager.table.pages[gids[0]]
    ctl.table.evict(rec, tracked=True)
    rec.busy = True  # its demotion drops the HBM copy now: a load waits for the move
    failed: list[BaseException] = []

    def load() -> None:
        try:
            ctl.wait_idle(gids, 5.0)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            failed.append(exc)

    waiter = threading.Thread(target=load)
    waiter.start()
    ctl.events.close_session("t", "a", 1.0)
    waiter.join(5.0)
    assert not waiter.is_alive() and isinstance(failed[0], UnknownPageKey)
    assert ctl.table.demand.waiting == {}  # it stopped wanting the page


def test_moves_of_two_tenants_sessions_of_one_name_take_separate_credits() -> None:
    ctl = Controller(make_strategy("lru"))
    ctl.add_hbm("h", 2 * MB)
    mine = _store(ctl, "t1", "main", [_meta("t1", "main", 0)])
    theirs = _store(ctl, "t2", "main", [_meta("t2", "main", 0)])
    _, demotes = ctl.admit("t2", "main", [_meta("t2", "main", 1)], 1.0)  # pushes t1's out
    assert [(a.gid, a.session) for a in demotes] == [(mine[0], SessionKey("t1", "main"))]
    _, demotes = ctl.admit("t1", "main", [_meta("t1", "main", 1)], 2.0)
    assert [(a.gid, a.session) for a in demotes] == [(theirs[0], SessionKey("t2", "main"))]


def test_a_load_in_flight_when_its_session_closes_ends_not_found_and_leaves_no_pin() -> None:
    ctl, (shared, mine), _prefetch = _prefetching()  # session "a"; the first page arriving
    ctl.table.open_session("t", "b")
    ctl.admit("t", "b", [replace(meta("b", 5), key=b"a/0")], 1.0)  # "b" holds it too
    loader = EngineLoader(ctl, _Worker(ctl), lambda results: None)
    failed: list[BaseException] = []

    def load() -> None:
        try:
            loader.load("t", "a", [b"a/0", b"a/1"])
        except BaseException as exc:  # noqa: BLE001 - inspected below
            failed.append(exc)

    waiter = threading.Thread(target=load)
    waiter.start()
    for _ in range(500):  # it pinned both pages and waits for the arriving one
        if ctl.manager.table.pages[mine].pins:
            break
        threading.Event().wait(0.01)
    closed, _ = ctl.events.close_session("t", "a", 2.0)
    waiter.join(5.0)
    assert (closed.retired, closed.kept) == (1, 1)
    assert not waiter.is_alive() and isinstance(failed[0], RefusedNotFound)
    assert ctl.manager.table.pages[shared].pins == 0  # "b"'s page keeps no pin of the load


def test_a_prefix_lookup_never_moves_a_page_id_the_session_stored() -> None:
    """A lookup names each page it finds by its position in the looked-up run. Looking up
    [X1] (stored as page 1) used to move page id 0 from X0 to X1, so an event about page 0
    (its task's end) then retired X1 and kept X0."""
    ctl = _controller()
    ctl.table.open_session("t", "a")
    x0, x1 = _meta("t", "a", 0), _meta("t", "a", 1)
    (g0, _), (g1, _) = ctl.admit("t", "a", [x0, x1], 0.0)[0]
    assert ctl.table.share(replace(x1, page_id=0), "h")  # held: loadable by this session
    assert [ctl.table.by_pid.get(("t", "a", i)) for i in (0, 1)] == [g0, g1]
    ctl.table.open_session("t", "b")  # a session that stored nothing: position = page id
    assert ctl.table.share(replace(x1, session="b", page_id=0), "h")
    assert ctl.table.by_pid.get(("t", "b", 0)) == g1


def test_a_close_leaves_the_summary_of_audited_pages_no_event_named() -> None:
    """Pages stored as ``verified_result`` or ``failed_branch`` that no event named are
    unknown to the event graph: a close retired them with no ``page_retired`` summary."""
    ctl = _controller()
    ctl.table.open_session("t", "a")
    kinds = (StateType.VERIFIED_RESULT, StateType.FAILED_BRANCH, StateType.EVIDENCE)
    ctl.admit("t", "a", [_meta("t", "a", i, kind=k) for i, k in enumerate(kinds)], 0.0)
    closed, deletions = ctl.events.close_session("t", "a", 1.0)
    assert closed.retired == 3 and len(deletions) == 3
    summaries = ctl.events.drain_audit()
    assert {s.state_type for s in summaries} == set(kinds[:2]) and len(summaries) == 2


def test_a_load_that_ends_after_its_session_closed_leaves_no_pin_on_a_shared_page() -> None:
    """The load pinned a page session "a" shares; "b" closed while the load ran. Its pin
    was kept (found by review: nothing tested it), so the page stayed unevictable until
    the pin TTL."""
    ctl = _controller()
    (shared,) = _store(ctl, "t", "a", [_meta("t", "a", 0, key=b"shared")])
    ctl.table.open_session("t", "b")
    assert ctl.table.share(_meta("t", "b", 0, key=b"shared"), "h")
    rec = ctl.table.pages[shared]
    ctl.table.pin(rec)  # b's load pins the page ...
    ctl.events.close_session("t", "b", 1.0)  # ... and b closes before the load ends
    assert rec.pins == 1 and shared in ctl.table.pages  # "a" keeps the page
    ctl.table.hold("t", "b", [shared], 2.0)
    assert rec.pins == 0 and not rec.view.pinned
