"""Closing a session retires its audited pages with their §5.2 summary and content hash
(tests/unit/service/).

The audited close path had no unit test of its own: a planner that wrote summaries only
for pages the event graph knew passed the unit suite, so a verified result the engine
stored (typed at store) and no event named left no trace when its session closed."""

from __future__ import annotations

from dataclasses import replace

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, meta


def _stored(kinds: list[StateType]) -> tuple[Controller, list[int]]:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 16 * MB)
    ctl.table.open_session("t", "s")
    metas = [replace(meta("s", i, kind), content_hash=bytes([i + 1]) * 16)
             for i, kind in enumerate(kinds)]
    out, _ = ctl.admit("t", "s", metas, 0.0)
    ctl.ingested([g for g, _ in out])
    return ctl, [g for g, _ in out]


def test_a_closed_sessions_audited_pages_leave_their_summary_and_hash() -> None:
    ctl, gids = _stored([StateType.VERIFIED_RESULT, StateType.FAILED_BRANCH,
                         StateType.TASK_INPUT])
    closed, deletions = ctl.events.close_session("t", "s", 1.0)
    assert closed.retired == 3
    assert sorted(a.gid for a in deletions if a.kind is ActionKind.DELETE) == sorted(gids)
    summaries = ctl.events.drain_audit()
    assert sorted((s.state_type.value, s.content_hash) for s in summaries) == sorted([
        (StateType.VERIFIED_RESULT.value, bytes([1]) * 16),
        (StateType.FAILED_BRANCH.value, bytes([2]) * 16)])  # the task input: no summary


def _event(ctl: Controller, version: int, now: float, **data: object) -> list:
    event = ctl.events.translate("t", "s", {"event_id": version, "task_id": "x",
                                            "version": version, "ts": now, **data})
    return ctl.apply(event, now)


def test_a_verified_result_of_an_open_task_leaves_its_summary_when_the_session_closes() -> None:
    """The task never ended: the page is still blocked (context, audit) when its session
    closes; it goes anyway, and its summary goes to the audit log first."""
    ctl, gids = _stored([StateType.FIXED_PREFIX, StateType.TASK_INPUT,
                         StateType.TEMP_REASONING])
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, 2, 0.2, kind="model_call", call_id="m1", consumes=[0, 1],
           produces=[[2, "temp_reasoning"]])
    _event(ctl, 3, 0.3, kind="verification_pass", call_id="v1", pages=[2])
    assert ctl.events.drain_audit() == []  # still live: nothing retired yet
    closed, _ = ctl.events.close_session("t", "s", 1.0)
    assert closed.closed and gids[2] not in ctl.table.pages
    assert [(s.state_type, s.content_hash) for s in ctl.events.drain_audit()] == [
        (StateType.VERIFIED_RESULT, bytes([3]) * 16)]
