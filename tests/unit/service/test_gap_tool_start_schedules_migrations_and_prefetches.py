"""A tool start on the live controller plans the tool gap (paper §3.3, eq. 6)
(tests/unit/service/).

No unit test looked at what a ``tool_start`` schedules: a controller whose tool starts
scheduled nothing (or no prefetch) passed the whole unit suite. Here a session fills its
HBM actor and calls a tool whose duration the predictor knows: AgentKV migrates pages
out during the gap and schedules each one back (a prefetch) after its migration, the
first ones ahead of the predicted return; LRU plans nothing; below the high watermark
AgentKV moves nothing either."""

from __future__ import annotations

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB, admitted, finish


def _event(ctl: Controller, version: int, now: float, **data: object) -> list:
    event = ctl.events.translate("t", "a", {"event_id": version, "task_id": "x",
                                            "version": version, "ts": now, **data})
    return ctl.apply(event, now)


def _tool_gap(policy: str, capacity: int = 4 * MB) -> tuple[Controller, list]:
    """Session a: four 1 MiB pages, then a 5 s ``build`` call. Returns the controller and
    every move the tool start produced: (start time, action), due at once or scheduled."""
    ctl = Controller(make_strategy(policy))
    if policy == "agentkv":
        for _ in range(20):
            ctl.strategy.predictor.observe_tool("build", 5.0)
    ctl.add_hbm("h", capacity)
    finish(ctl, admitted(ctl, "a", range(4), 0.0), 0.0)
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1, 2, 3])
    due = _event(ctl, 2, 0.2, kind="tool_start", call_id="k1", tool="build")
    moves = [(0.2, a) for a in due if a.kind is not ActionKind.DELETE] + list(ctl.schedule)
    return ctl, moves


def test_agentkv_migrates_in_the_gap_and_prefetches_before_the_predicted_return() -> None:
    ctl, moves = _tool_gap("agentkv")
    out = {a.gid: at for at, a in moves if a.kind is ActionKind.DEMOTE and a.reason is Reason.GAP}
    back = {a.gid: at for at, a in moves
            if a.kind is ActionKind.RESTORE and a.reason is Reason.PREFETCH}
    assert out, "a tool start on a full HBM actor migrates pages out during the gap"
    assert back, "pages migrated for the gap are prefetched back"
    for gid, at in back.items():  # back after it went out
        assert gid in out and at >= out[gid]
    (_tool, _started, plan) = ctl.table.sessions[("t", "a")].tools["k1"]
    assert plan is not None and min(back.values()) <= plan.predicted_return


def test_lru_plans_nothing_for_a_tool_gap() -> None:
    _ctl, moves = _tool_gap("lru")
    assert moves == []


def test_below_the_watermark_agentkv_moves_nothing_for_a_gap() -> None:
    _ctl, moves = _tool_gap("agentkv", capacity=64 * MB)
    assert moves == []
