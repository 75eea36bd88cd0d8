"""Prefetches on the live path do no harm, and predictions are current when they decide.

Pure controller and strategy (no Ray, no bytes). Each test fails when its mechanism is
taken out: a refill may displace only pages read after it (else two sessions' prefetches
push each other out in turn, or a prefetch evicts the session that returns next); a
page's predicted return is the whole gap from its last access; confidences and overdue
returns are refreshed before a decision; and the service never picks the recompute-only
form it cannot serve.
"""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.agentkv import AgentKvPolicy
from agentkv_cluster.policy.base import PageView, StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, Reason
from agentkv_cluster.runtime.strategies import AgentKvStrategy, Learned, make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, finish


def _event(ctl: Controller, session: str, version: int, now: float, **data: object) -> None:
    event = ctl.events.translate("t", session, {"event_id": version, "task_id": "x",
                                                "version": version, "ts": now, **data})
    ctl.apply(event, now)


def _trained(durations: dict[str, float]) -> Controller:
    ctl = Controller(make_strategy("agentkv"))
    for tool, seconds in durations.items():
        for _ in range(6):
            ctl.strategy.predictor.observe_tool(tool, seconds)
    ctl.add_hbm("h", 2 * MB)
    return ctl


def _in_tool(ctl: Controller, session: str, pages: int, now: float, tool: str) -> list[int]:
    finish(ctl, admitted(ctl, session, range(pages), now), now)
    gids = ctl.table.resolve("t", session, [f"{session}/{p}".encode() for p in range(pages)])
    _event(ctl, session, 1, now, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=list(range(1, pages)))
    _event(ctl, session, 2, now + 0.01, kind="tool_start", call_id="k1", tool=tool)
    return gids


def _refill(next_tool: str) -> tuple[Controller, int, list[int], list]:
    """Session a (in a 0.5 s tool) has its page pushed out by session c's two pages;
    c's next read is predicted by a ``next_tool`` call (set on its pages, so no gap
    migration of c frees room meanwhile). Returns the controller, a's page, c's pages
    and the actions due when a's refill comes due."""
    ctl = _trained({"fast": 0.5, "slow": 5.0, "instant": 0.05})
    (a,) = _in_tool(ctl, "a", 1, 0.0, "fast")
    finish(ctl, admitted(ctl, "c", range(2), 0.1), 0.1)
    cs = ctl.table.resolve("t", "c", [b"c/0", b"c/1"])
    for g in cs:
        ctl.table.pages[g].view.tool_class = next_tool
        ctl.strategy.prepare(ctl.table.pages[g], 0.1)
    assert not ctl.table.pages[a].resident and ctl.table.pages[a].copies
    refill = [(at, x) for at, x in ctl.schedule if x.gid == a]
    assert [x.reason for _at, x in refill] == [Reason.REFILL]
    return ctl, a, cs, ctl.due(refill[0][0])


def test_a_refill_displaces_a_page_read_after_it() -> None:
    ctl, a, cs, actions = _refill("slow")  # c returns in 5 s, a in 0.5 s
    kinds = sorted((x.kind.value, x.gid) for x in actions)
    assert ("restore", a) in kinds and any(k == "demote" and g in cs for k, g in kinds)
    assert ctl.table.pages[a].resident
    assert [x.reason for x in actions if x.kind is ActionKind.RESTORE] == [Reason.PREFETCH]


def test_a_refill_never_displaces_a_page_read_before_it() -> None:
    ctl, a, cs, actions = _refill("instant")  # c is back before a: a must wait
    assert actions == []
    assert not ctl.table.pages[a].resident and all(ctl.table.pages[g].resident for g in cs)


def _view(pid: int, read_at: float, tool: str = "t") -> PageView:
    return PageView(page_id=pid, size_bytes=MB, state_type=StateType.EVIDENCE, session="s",
                    tenant="t", last_access=0.0, predicted_idle_s=read_at, tool_class=tool,
                    confidence=1.0)


def test_do_no_harm_admission_takes_only_pages_read_later() -> None:
    policy = AgentKvPolicy(AgentKvStrategy().config)
    policy.on_insert(_view(1, read_at=1.0), 0.0)
    policy.on_insert(_view(2, read_at=5.0), 0.0)
    got = policy.admit_prefetch(_view(3, read_at=2.0), MB, 0.5, not_before=2.1)
    assert got.admitted and got.victims == (2,)
    policy.on_insert(_view(4, read_at=1.5), 0.0)
    refused = policy.admit_prefetch(_view(5, read_at=2.0), 2 * MB, 0.5, not_before=2.1)
    assert not refused.admitted  # page 3 (2.0) and page 4 (1.5) are read before 2.1
    assert {p.page_id for p in policy.tracked()} == {1, 3, 4}


def test_a_page_prepared_mid_gap_keeps_its_predicted_return() -> None:
    ctl = _trained({"slow": 2.0})
    (g,) = _in_tool(ctl, "a", 1, 0.0, "slow")
    view = ctl.table.pages[g].view
    ctl.strategy.prepare(ctl.table.pages[g], 1.0)  # halfway through its 2 s tool
    assert view.predicted_idle_s == pytest.approx(
        ctl.strategy.predictor.gap_estimate(view, 1.0))
    assert view.last_access + view.predicted_idle_s > 1.5  # not "half the residual from 0"


def test_refresh_brings_stale_confidences_and_overdue_returns_up_to_now() -> None:
    strategy = AgentKvStrategy()
    policy = strategy.new_policy(4 * MB)
    stale = _view(1, read_at=0.2, tool="grep")
    stale.confidence = 0.0  # admitted before any grep call had returned
    policy.on_insert(stale, 0.0)
    assert policy.conservative()
    for _ in range(6):
        strategy.predictor.observe_tool("grep", 1.0)
    strategy.refresh(policy, 3.0)
    assert not policy.conservative()
    assert stale.last_access + stale.predicted_idle_s >= 3.0  # overdue: the residual law


def test_the_service_never_keeps_a_page_only_as_recompute() -> None:
    ctl = _trained({})
    finish(ctl, admitted(ctl, "a", range(1), 0.0), 0.0)
    rec = ctl.table.pages[ctl.table.resolve("t", "a", [b"a/0"])[0]]
    rec.view.recompute_cost_s = 1e-6  # re-prefill would be the cheapest form on paper
    tier, codec, _ref = ctl.strategy.demotion(rec, ctl.table.hbms["h"].policy, 0.1)
    assert (tier, codec) == (Tier.HOST, Codec.FULL)
    placement = ctl.table.hbms["h"].policy.demotion(rec.view)
    assert placement.codec is Codec.RECOMPUTE  # what the simulator's engine may do


def test_what_agentkv_learned_goes_to_its_next_controller_only() -> None:
    first = AgentKvStrategy()
    first.predictor.observe_tool("grep", 1.0)
    learned = first.learned()
    assert isinstance(learned, Learned)
    carried = make_strategy("agentkv", learned).predictor
    assert carried is not learned.predictor  # its own copy
    assert carried.tools.distribution("grep").n == 1
    assert make_strategy("agentkv").predictor.tools.distribution("grep").n == 0
    assert make_strategy("lru").learned() is None
    with pytest.raises(ValueError, match="learned state"):
        make_strategy("lru", learned)


def test_a_lossy_restore_pays_its_own_path_in_the_cost_model() -> None:
    from agentkv_cluster.policy.base import CostModel

    plain, hop = CostModel(), CostModel(codec_fixed_s=0.01)
    for codec in (Codec.INT8, Codec.INT4):
        extra = hop.restore_time(MB, Tier.HOST, codec) - plain.restore_time(MB, Tier.HOST, codec)
        assert extra == pytest.approx(0.01)
    assert hop.restore_time(MB, Tier.HOST, Codec.FULL) == plain.restore_time(MB, Tier.HOST,
                                                                             Codec.FULL)
