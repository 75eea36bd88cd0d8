"""The paper's core on the service's live path (pure controller: no Ray, no bytes).

Each test fails when its mechanism is taken out of the controller: type transitions from
the event graph reach the policy's page record, retired audited pages leave a summary
with their content hash, and the reuse predictor (eq. 2) learns online from what the
service observes, with its calibration live and a poorly calibrated predictor sending
the policy to its conservative (LRU) fallback.
"""

from __future__ import annotations

from dataclasses import replace

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, KvShape, PageMeta
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, admitted, done, finish, meta

TYPES = (StateType.FIXED_PREFIX, StateType.TASK_INPUT, StateType.TEMP_REASONING)


def _event(ctl: Controller, session: str, version: int, now: float, **data: object) -> list:
    event = ctl.events.translate("t", session, {"event_id": version, "task_id": "x",
                                                "version": version, "ts": now, **data})
    return ctl.apply(event, now)


def _task(policy: str = "agentkv", session: str = "a") -> tuple[Controller, list[int]]:
    """One session: prefix, input and one draft (temporary reasoning) page, all resident."""
    ctl = Controller(make_strategy(policy))
    ctl.add_hbm("h", 16 * MB)
    ctl.table.open_session("t", session)
    metas = [replace(meta(session, i, kind), content_hash=bytes([i]) * 16)
             for i, kind in enumerate(TYPES)]
    out, _ = ctl.admit("t", session, metas, 0.0)
    finish(ctl, ctl.ingested([g for g, _ in out]), 0.0)  # the prefix's write-through
    _event(ctl, session, 1, 0.1, kind="task_start", prefix_generation=1, prefix_pages=[0],
           input_pages=[1])
    _event(ctl, session, 2, 0.2, kind="model_call", call_id="m1", consumes=[0, 1],
           produces=[[2, "temp_reasoning"]])
    return ctl, [g for g, _ in out]


def test_a_verified_draft_reaches_the_policy_as_a_verified_result() -> None:
    ctl, (_, _, draft) = _task()
    view = ctl.table.pages[draft].view
    assert view.state_type is StateType.TEMP_REASONING
    _event(ctl, "a", 3, 0.3, kind="verification_pass", call_id="v1", pages=[2])
    assert view.state_type is StateType.VERIFIED_RESULT
    assert view.correctness_weight == TYPE_DEFAULTS[StateType.VERIFIED_RESULT].correctness_weight
    assert ctl.stats["retyped"] == 1


def test_pages_of_a_rolled_back_branch_become_failed_branch() -> None:
    ctl, _ = _task()
    _event(ctl, "a", 3, 0.3, kind="branch_create", branch="try")
    pm = PageMeta(key=b"a/9", digest=b"d" * 32, tenant="t", namespace="t", session="a",
                  page_id=9, state_type=StateType.TEMP_REASONING, length=MB, tokens=16)
    out, _ = ctl.admit("t", "a", [pm], 0.4)
    ctl.ingested([g for g, _ in out])
    _event(ctl, "a", 4, 0.5, kind="model_call", call_id="m2", branch="try", consumes=[0],
           produces=[[9, "temp_reasoning"]])
    _event(ctl, "a", 5, 0.6, kind="rollback", branch="try")
    gid = out[0][0]
    if gid in ctl.table.pages:  # still held (audit), or retired at once: both saw the new type
        assert ctl.table.pages[gid].view.state_type is StateType.FAILED_BRANCH
    else:
        assert [s.state_type for s in ctl.events.audit_summaries] == [StateType.FAILED_BRANCH]


def test_a_retired_audited_page_leaves_its_summary_and_content_hash() -> None:
    ctl, (_, _, draft) = _task()
    _event(ctl, "a", 3, 0.3, kind="verification_pass", call_id="v1", pages=[2])
    actions = _event(ctl, "a", 4, 0.4, kind="task_end")
    assert draft in {a.gid for a in actions if a.kind is ActionKind.DELETE}
    summaries = ctl.events.drain_audit()
    assert [(s.state_type, s.content_hash) for s in summaries] == [
        (StateType.VERIFIED_RESULT, bytes([2]) * 16)]
    assert summaries[0].record()["content_hash"] == (bytes([2]) * 16).hex()
    assert ctl.events.drain_audit() == []  # drained once


def test_unaudited_pages_retire_without_a_summary() -> None:
    ctl, _ = _task()
    actions = _event(ctl, "a", 3, 0.3, kind="task_end")
    assert any(a.kind is ActionKind.DELETE for a in actions)
    assert ctl.events.drain_audit() == []


def test_the_predictor_learns_from_reads_and_retirements_in_the_service() -> None:
    ctl, gids = _task()
    strategy = ctl.strategy
    assert strategy.calibration().outcomes == 0
    ctl.access(gids[:2], 1.0)  # two pages read again: positive outcomes
    assert strategy.calibration().outcomes == 2
    ctl.table.unpin(gids[:2], 1.1)
    _event(ctl, "a", 3, 1.2, kind="task_end")  # the draft retires unread: a negative one
    health = strategy.calibration()
    assert health.outcomes == 3 and health.brier is not None


def test_lru_learns_nothing() -> None:
    ctl, gids = _task("lru")
    ctl.access(gids, 1.0)
    assert ctl.strategy.calibration() is None


def test_a_miscalibrated_predictor_sends_the_policy_to_its_lru_fallback() -> None:
    """Pages predicted likely to be reused that never are: calibration error grows until
    the policy stops trusting its predictions and evicts in LRU order."""
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 4096 * MB)
    policy = ctl.table.hbms["h"].policy
    ctl.table.open_session("t", "s")
    metas = [meta("s", i, StateType.EVIDENCE) for i in range(80)]
    for _ in range(20):  # the tool class the pages wait on is well known: data is no issue
        ctl.strategy.predictor.observe_tool("grep", 1.0)
    out, _ = ctl.admit("t", "s", metas, 0.0)
    ctl.ingested([g for g, _ in out])
    for gid, _ in out:
        ctl.table.pages[gid].view.tool_class = "grep"
        ctl.strategy.prepare(ctl.table.pages[gid], 0.5)
    assert not policy.conservative()
    for gid, _ in out:  # every prediction is wrong: none of them is read again
        ctl.strategy.observe(ctl.table.pages[gid], False, 1.0, policy)
    health = ctl.strategy.calibration()
    # ECE of 0.25 or worse leaves the predictor no skill (Predictor.confidence)
    assert health.outcomes == 80 and health.calibration_error > 0.25
    for gid, _ in out:  # the next predictions carry the predictor's low confidence
        ctl.strategy.prepare(ctl.table.pages[gid], 2.0)
    assert policy.conservative() and health.conservative is False
    assert ctl.strategy.calibration().conservative


def _victim_tiers(capacity: dict | None) -> tuple[list, list]:
    """Sessions a, b, c of two 1 MiB pages each through a 2 MiB HBM: a's pages demoted
    (each copy charged 1 MiB to its tier), then the tiers chosen for b's."""
    ctl = Controller(make_strategy("agentkv"), tier_capacity=capacity)
    ctl.add_hbm("h", 2 * MB, pool="p")
    first = admitted(ctl, "a", range(2), 0.0) + admitted(ctl, "b", range(2), 1.0)
    for a in first:
        ctl.finished(done(a, copies=((a.tier, a.codec),), tier_bytes=(MB,), pool="p"), 1.0)
    second = admitted(ctl, "c", range(2), 2.0)
    return [a.tier for a in first], [a.tier for a in second]


def test_demotions_see_their_pool_tiers_fill_up() -> None:
    """Eq. 4-5 on the live path: with the pool's host tier full (2 MiB of 2 MiB held),
    the next victims go to NVMe; with unbounded tiers the same victims go to the host."""
    first, unbounded = _victim_tiers(None)
    assert first == [Tier.HOST, Tier.HOST] and unbounded == [Tier.HOST, Tier.HOST]
    first, bounded = _victim_tiers({Tier.HOST: 2 * MB, Tier.NVME: 64 * MB})
    assert first == [Tier.HOST, Tier.HOST] and bounded == [Tier.NVME, Tier.NVME]


def test_capacity_prices_rise_when_kept_pages_exceed_a_tier() -> None:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 64 * MB)
    ctl.table.open_session("t", "s")
    out, _ = ctl.admit("t", "s", [meta("s", i) for i in range(40)], 0.0)
    views = [ctl.table.pages[g].view for g, _ in out]
    policy = ctl.table.hbms["h"].policy
    roomy = ctl.strategy.tier_prices(policy, views, {Tier.HOST: 1 << 40, Tier.NVME: 1 << 40})
    tight = ctl.strategy.tier_prices(policy, views, {Tier.HOST: 4 * MB, Tier.NVME: 1 << 40})
    assert roomy == (0.0, 0.0) and tight[0] > 0.0


def test_the_return_model_learns_how_the_services_idle_gaps_end() -> None:
    """The cost-aware prefetch rule's return model hears, from the live service, each
    page read again after a tool call (a return) and each page retired unread (an end)."""
    ctl, gids = _task()
    returns = ctl.table.hbms["h"].policy.returns
    _event(ctl, "a", 3, 0.3, kind="tool_start", call_id="k1", tool="grep")
    _event(ctl, "a", 4, 1.3, kind="observation_return", call_id="k1")
    ctl.access(gids[:2], 1.4)  # two pages read again after the tool
    assert returns.observed == 2
    ctl.table.unpin(gids[:2], 1.5)
    retired = [a for a in _event(ctl, "a", 5, 1.6, kind="task_end")
               if a.kind is ActionKind.DELETE]
    assert retired and returns.observed == 2 + len(retired)  # each retirement is an end


def test_a_lossy_copy_the_risk_controller_would_back_with_a_reference_is_kept_full() -> None:
    """Lossy + FULL reference is dominated here (the service verifies every lossy working
    copy by fetching the reference): such a victim is demoted FULL, with no reference."""
    from agentkv_cluster.policy.base import Placement

    ctl, gids = _task()
    policy = ctl.table.hbms["h"].policy
    rec = ctl.table.pages[gids[1]]
    rec.meta = replace(rec.meta, shape=KvShape(layers=1, kv_heads=1, tokens=8, head_dim=4))

    def lossy_with_reference(view, free=None, mu=(0.0, 0.0), recompute=True):
        return Placement(page_id=view.page_id, tier=Tier.HOST, codec=Codec.INT4,
                         stored_bytes=MB // 4, reference_tier=Tier.NVME, reference_bytes=MB)

    policy.demotion = lossy_with_reference
    assert ctl.strategy.demotion(rec, policy, 1.0) == (Tier.HOST, Codec.FULL, False)

    def lossy_alone(view, free=None, mu=(0.0, 0.0), recompute=True):
        return Placement(page_id=view.page_id, tier=Tier.HOST, codec=Codec.INT4,
                         stored_bytes=MB // 4, reference_tier=None, reference_bytes=0)

    policy.demotion = lossy_alone
    assert ctl.strategy.demotion(rec, policy, 1.0) == (Tier.HOST, Codec.INT4, False)
