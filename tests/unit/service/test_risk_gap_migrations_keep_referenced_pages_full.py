"""The risk controller's FULL copies hold on the tool-gap path too (tests/unit/service/).

A gap migration's codec comes from the gap planner (INT4 clamped by the risk decision's
lossy limit, which for reference-keeping pages is INT4 too: the reference absorbs the
error). The service keeps no separate reference, so such a page must leave FULL. Only
pressure demotions had a unit test (with the policy's choice monkeypatched); a strategy
that sent verified results and evidence out INT4 with no reference during tool gaps
passed the unit suite."""

from __future__ import annotations

from dataclasses import replace

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, KvShape, Reason
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec
from tests.unit.service.test_controller import MB, meta

SHAPE = KvShape(layers=1, kv_heads=1, tokens=8, head_dim=4)  # INT8 / INT4 can encode it
KINDS = (StateType.FIXED_PREFIX, StateType.TASK_INPUT, StateType.EVIDENCE,
         StateType.TEMP_REASONING, StateType.TEMP_REASONING)


def _event(ctl: Controller, version: int, now: float, **data: object) -> list:
    event = ctl.events.translate("t", "a", {"event_id": version, "task_id": "x",
                                            "version": version, "ts": now, **data})
    return ctl.apply(event, now)


def test_gap_migrations_of_referenced_pages_are_full_and_drafts_may_be_lossy() -> None:
    ctl = Controller(make_strategy("agentkv"))
    for _ in range(20):  # a tool the predictor knows: confident, no conservative fallback
        ctl.strategy.predictor.observe_tool("build", 5.0)
    ctl.add_hbm("h", len(KINDS) * MB)  # full: above the gap watermark
    ctl.table.open_session("t", "a")
    metas = [replace(meta("a", i, kind), shape=SHAPE) for i, kind in enumerate(KINDS)]
    out, _ = ctl.admit("t", "a", metas, 0.0)
    ctl.ingested([g for g, _ in out])
    gids = [g for g, _ in out]
    _event(ctl, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, 2, 0.2, kind="model_call", call_id="m1", consumes=[0, 1],
           produces=[[2, "evidence"], [3, "temp_reasoning"], [4, "temp_reasoning"]])
    _event(ctl, 3, 0.3, kind="verification_pass", call_id="v1", pages=[3])
    types = {g: ctl.table.pages[g].view.state_type for g in gids}
    assert types[gids[3]] is StateType.VERIFIED_RESULT
    due = _event(ctl, 4, 0.4, kind="tool_start", call_id="k1", tool="build")
    gap = [a for a in due + [a for _at, a in ctl.schedule]
           if a.kind is ActionKind.DEMOTE and a.reason is Reason.GAP]
    by_type: dict[StateType, set[Codec]] = {}
    for a in gap:
        by_type.setdefault(types[a.gid], set()).add(a.codec)
        assert not a.reference  # the service keeps no separate reference copy
    referenced = {StateType.FIXED_PREFIX, StateType.EVIDENCE, StateType.VERIFIED_RESULT}
    assert referenced & set(by_type), f"no referenced page migrated: {by_type}"
    for kind in referenced & set(by_type):
        assert by_type[kind] == {Codec.FULL}, (kind, by_type[kind])
    assert any(c is not Codec.FULL for c in by_type.get(StateType.TEMP_REASONING, ())), \
        f"a draft may leave lossy (else this test shows nothing): {by_type}"
