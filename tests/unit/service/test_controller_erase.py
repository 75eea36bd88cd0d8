"""Tenant erasure in the controller's bookkeeping (pure: no Ray, no bytes): pages the
event graph still needs, pins, waiting loads and queued moves all give way, and the
same tenant name starts empty afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.records import Action, ActionKind, Reason, TenantErased
from tests.unit.service.test_controller import admitted, done
from tests.unit.service.test_controller_return import _event, _session


def _task_in_a_tool_call() -> tuple[Controller, list[int]]:
    """Tenant "t", session "a": two pages the running task reads, a tool call open."""
    return _session()


def test_pages_the_graph_still_needs_are_forgotten_with_their_pins_and_moves() -> None:
    ctl, gids = _task_in_a_tool_call()
    assert not ctl.events.graph.is_retirable(gids[1])  # retire() would refuse it
    ctl.access(gids, 0.3)  # pinned by a load that was never released
    gone = ctl.forget_tenant("t")
    assert (gone.pages, gone.pins, gone.sessions) == (2, 2, 1)
    assert ctl.table.pages == {} and ctl.events.graph.page_ids() == frozenset()
    assert not any(a.gid in gids for _, a in ctl.schedule)
    assert ctl.table.hbms["h"].used == 0


def test_the_return_model_keeps_no_open_gap_of_an_erased_page() -> None:
    ctl, gids = _task_in_a_tool_call()  # the tool call opened an idle gap per page
    views = [ctl.table.pages[g].view for g in gids]
    returns = ctl.table.hbms["h"].policy.returns
    ctl.forget_tenant("t")
    assert not any(returns.forget(v.page_id) for v in views)  # already dropped
    assert returns.close_open_gaps(now=9.0) == 0 and returns.observed == 0


def test_calls_of_a_tenant_being_erased_fail_and_the_name_starts_empty_after() -> None:
    ctl, _ = _task_in_a_tool_call()
    ctl.forget_tenant("t")
    with pytest.raises(TenantErased):
        ctl.table.open_session("t", "a")
    with pytest.raises(TenantErased):
        ctl.table.resolve("t", "a", [b"a/0"])
    ctl.table.end_erase("t")
    admitted(ctl, "a", range(1), 1.0)  # the same names again, version 1 again
    _event(ctl, 1, 1.1, kind="task_start", prefix_generation=1, prefix_pages=[0])
    assert len(ctl.table.pages) == 1 and ctl.table.erasures["t"] == 1


def _erased_while_waiting(ctl: Guarded, wait: Callable[[], object], moving: Action) -> None:
    """A load blocked in ``wait`` on a page whose ``moving`` transfer is in flight fails with
    ``TenantErased`` as soon as the erasure starts; the erasure itself waits for the
    transfer to end, then drops everything of the tenant."""
    failed: list[BaseException] = []

    def load() -> None:
        try:
            wait()
        except BaseException as exc:  # noqa: BLE001 - inspected below
            failed.append(exc)

    waiter = threading.Thread(target=load)
    waiter.start()
    eraser = threading.Thread(target=ctl.forget_tenant, args=("t", 5.0))
    eraser.start()
    waiter.join(5.0)
    assert not waiter.is_alive() and isinstance(failed[0], TenantErased)
    assert eraser.is_alive()  # the erasure waits for the transfer in flight
    fields = {"source": "host"} if moving.kind is ActionKind.RESTORE else {}
    ctl.finished(done(moving, **fields), 0.5)
    eraser.join(5.0)
    assert not eraser.is_alive() and ctl.table.pages == {}


def test_a_load_waiting_for_a_moving_page_fails_with_tenant_erased() -> None:
    bare, gids = _task_in_a_tool_call()
    ctl = Guarded(bare)  # as the controller actor runs it: waits happen in the guard
    ctl.table.evict(ctl.table.pages[gids[0]], tracked=True)
    ctl.table.pages[gids[0]].busy = True  # a demotion is in flight
    _erased_while_waiting(ctl, lambda: ctl.access_settled(gids, lambda: 0.4), Action(
        kind=ActionKind.DEMOTE, gid=gids[0], hbm="h", reason=Reason.PRESSURE, session="a"))


def test_queued_moves_of_an_erased_tenant_are_moot() -> None:
    ctl, gids = _task_in_a_tool_call()
    assert not ctl.table.doomed(gids[0])
    ctl.table.erasing.add("t")
    assert ctl.table.doomed(gids[0]) and not ctl.table.doomed(10_000)


def test_a_load_waiting_for_an_arriving_page_fails_with_tenant_erased() -> None:
    bare, gids = _task_in_a_tool_call()
    ctl = Guarded(bare)
    ctl.table.pages[gids[0]].busy = True  # resident and busy: its bytes are arriving
    assert ctl.table.settled(gids) and not ctl.table.arrived(gids)
    _erased_while_waiting(ctl, lambda: ctl.wait_arrived(gids, 5.0), Action(
        kind=ActionKind.RESTORE, gid=gids[0], hbm="h", reason=Reason.PREFETCH, session="a"))


def _tool_call(ctl: Controller, tenant: str, session: str, tool: str, at: float) -> None:
    """``session`` of ``tenant`` calls ``tool`` and it returns 1 s later."""
    ctl.table.open_session(tenant, session)
    for version, (kind, extra) in enumerate((
            ("task_start", {"prefix_generation": 1}),
            ("tool_start", {"call_id": "k", "tool": tool}),
            ("observation_return", {"call_id": "k"})), start=1):
        event = ctl.events.translate(tenant, session, {
            "event_id": version, "task_id": "x", "version": version, "ts": at + version,
            "kind": kind, **extra})
        ctl.apply(event, at + version)


def test_tool_classes_only_an_erased_tenant_called_leave_the_predictor() -> None:
    ctl, _gids = _task_in_a_tool_call()  # tenant "t" calls "grep"
    _tool_call(ctl, "t", "b", "t-only-tool", 2.0)
    _tool_call(ctl, "u", "b", "grep", 2.0)  # another tenant calls "grep" too
    tools = ctl.strategy.predictor.tools
    assert tools.distribution("t-only-tool").n == 1
    seen = tools.distribution("grep").n
    ctl.forget_tenant("t")
    assert tools.distribution("t-only-tool").n == 0  # its name and durations are gone
    assert tools.distribution("grep").n == seen  # a class another tenant calls stays
    assert all(k[0] != "t" for k in ctl.strategy._last_tool)
