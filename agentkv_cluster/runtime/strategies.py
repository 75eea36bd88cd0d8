"""Glue from the controller to one policy family: the LRU baseline or AgentKV.

A strategy answers four questions with the pure policy objects and nothing else:
which eviction policy runs per HBM actor, in what form a victim is kept, which
copy a restore reads, and what a tool start schedules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.types import SessionKey
from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy
from agentkv_cluster.policy.base import CostModel, EvictionPolicy, GapPlan, PageView, ToolStart
from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.runtime.records import Action, ActionKind, PageRecord, Reason
from agentkv_cluster.runtime.tier_ledger import TierRoom
from agentkv_cluster.runtime.tuning import RUNTIME_AGENTKV
from store.types import Codec, Tier

# The forms the service stores (the policy core also knows LOW_RANK and RECOMPUTE).
SERVICE_CODECS = (Codec.FULL, Codec.INT8, Codec.INT4)


def exact_form() -> tuple[Codec, bool]:
    """The form of a page whose lossy working copy the risk controller would back with a
    FULL reference: FULL alone, no reference. The service hands engines exact bytes
    (``complete_load`` fetches the reference of every lossy working copy), so lossy plus
    reference moves more bytes (the lossy copy and the FULL one) and restores slower
    (the lossy restore, then the reference fetch) than one FULL copy: a dominated option.
    Returns (codec, keep a separate reference)."""
    return Codec.FULL, False


def clamp(codec: Codec, shaped: bool) -> Codec:
    """The service stores FULL, INT8 and INT4; opaque pages (no KV geometry) only FULL."""
    if not shaped:
        return Codec.FULL
    return codec if codec in SERVICE_CODECS else Codec.INT4


class Strategy(Protocol):
    name: str

    def new_policy(self, capacity: int) -> EvictionPolicy: ...

    def demotion(self, rec: PageRecord, policy: EvictionPolicy, now: float,
                 room: TierRoom | None = None) -> tuple[Tier, Codec, bool]: ...

    def tier_prices(self, policy: EvictionPolicy, views: list[PageView],
                    capacity: Mapping[Tier, int]) -> tuple[float, float]: ...

    def restore_source(self, rec: PageRecord) -> tuple[Tier, Codec]: ...

    def prepare(self, rec: PageRecord, now: float) -> None: ...

    def refresh(self, policy: EvictionPolicy, now: float) -> None: ...

    def admit_prefetch(self, rec: PageRecord, policy: EvictionPolicy, tier: Tier, codec: Codec,
                       short: int, now: float) -> list[int] | None: ...

    def gap_plan(self, recs: Sequence[PageRecord], event: ev.ToolStart, policy: EvictionPolicy,
                 now: float) -> tuple[list[Action], GapPlan | None]: ...

    def tool_return(self, plan: GapPlan | None, recs: Sequence[PageRecord],
                    policy: EvictionPolicy, tool: str, started: float, now: float) -> None: ...

    def prefetch_at(self, rec: PageRecord, plan: GapPlan | None, tier: Tier, codec: Codec,
                    now: float) -> float | None: ...

    def observe(self, rec: PageRecord, reused: bool, now: float,
                policy: EvictionPolicy | None) -> None: ...

    def calibration(self) -> PredictorHealth | None: ...

    def learned(self) -> Learned | None: ...

    def forget(self, rec: PageRecord, policy: EvictionPolicy | None) -> None: ...

    def forget_tenant(self, tenant: str) -> None: ...

    def forget_session(self, tenant: str, session: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Learned:
    """What a strategy learned online from the service's traffic, handed to the next
    controller of the same policy (``Service.use_policy``) as a running service keeps it:
    the reuse predictor (tool-duration laws, eq. 2 weights, calibration window)."""

    policy: str
    predictor: Predictor


@dataclass(frozen=True, kw_only=True)
class PredictorHealth:
    """The live reuse predictor's calibration (paper §2.2): outcomes seen, Brier score,
    expected calibration error, and whether the policy trusts it (else: conservative LRU)."""

    outcomes: int
    brier: float | None
    calibration_error: float | None
    conservative: bool


class LruStrategy:
    """The paper's LRU baseline: evict least recently used, keep FULL on the host, restore FULL."""

    name = "lru"

    def new_policy(self, capacity: int) -> EvictionPolicy:
        return LruPolicy()

    def demotion(self, rec: PageRecord, policy: EvictionPolicy, now: float,
                 room: TierRoom | None = None) -> tuple[Tier, Codec, bool]:
        return Tier.HOST, Codec.FULL, False  # the pool spills to NVMe when its host is full

    def tier_prices(self, policy, views, capacity) -> tuple[float, float]:
        return (0.0, 0.0)

    def restore_source(self, rec: PageRecord) -> tuple[Tier, Codec]:
        codec = Codec.FULL if Codec.FULL in rec.copies else min(rec.copies)
        return rec.copies[codec], codec

    def prepare(self, rec: PageRecord, now: float) -> None:
        return None

    def refresh(self, policy: EvictionPolicy, now: float) -> None:
        return None

    def admit_prefetch(self, rec, policy, tier, codec, short, now) -> list[int] | None:
        return None  # LRU never prefetches

    def gap_plan(self, recs, event, policy, now):
        return [], None

    def tool_return(self, plan, recs, policy, tool, started, now) -> None:
        return None

    def prefetch_at(self, rec, plan, tier, codec, now) -> float | None:
        return None  # LRU never prefetches

    def observe(self, rec: PageRecord, reused: bool, now: float,
                policy: EvictionPolicy | None) -> None:
        return None  # LRU predicts nothing

    def forget(self, rec: PageRecord, policy: EvictionPolicy | None) -> None:
        pass  # LRU learns nothing per page

    def forget_tenant(self, tenant: str) -> None:
        pass  # nor per tenant

    def forget_session(self, tenant: str, session: str) -> None:
        pass  # nor per session

    def calibration(self) -> PredictorHealth | None:
        return None

    def learned(self) -> Learned | None:
        return None  # LRU learns nothing


class AgentKvStrategy:
    """Value-ordered eviction, risk-bounded compression, tool-gap migration and prefetch."""

    name = "agentkv"

    def __init__(self, config: AgentKvConfig | None = None, learned: Learned | None = None
                 ) -> None:
        self.config = config or RUNTIME_AGENTKV
        # A copy it owns: arrays that crossed Ray arrive read-only (zero-copy numpy).
        self.predictor = (copy.deepcopy(learned.predictor) if learned
                          else Predictor(self.config.predictor))
        # (tenant, session) -> tool class of its latest call
        self._last_tool: dict[tuple[str, str], str] = {}
        self._tools_of: dict[str, set[str]] = {}  # tenant -> tool classes it called
        self._policies: list[AgentKvPolicy] = []  # one per HBM actor, one shared predictor

    def new_policy(self, capacity: int) -> EvictionPolicy:
        policy = AgentKvPolicy(self.config, predictor=self.predictor)
        self._policies.append(policy)
        return policy

    def prepare(self, rec: PageRecord, now: float) -> None:
        """Fill the predictor's view of the page before a policy decision."""
        view = rec.view
        if not view.tool_class:  # a page waits on its session's tools: use the latest class
            view.tool_class = self._last_tool.get((view.tenant, view.session), "")
        pred = self.predictor.predict(view, now)
        rec.phi = self.predictor.features(view, now)  # labelled by ``observe`` later
        view.reuse_prob = min(1.0, max(0.0, 0.5 * (pred.p_reuse + view.reuse_prob)))
        # The whole gap from last_access (base.py), not the residual life from now: a page
        # prepared halfway through its session's tool call keeps its predicted return.
        view.predicted_idle_s = self.predictor.gap_estimate(view, now)
        view.confidence = pred.confidence

    def refresh(self, policy: EvictionPolicy, now: float) -> None:
        """Before a victim choice or a prefetch admission, the tracked pages' predictions
        as of ``now``: confidence from the predictor as it is now (a page admitted before
        any tool of its class returned would keep confidence 0, and hold the policy in
        its conservative fallback long after the predictor has learned), and for a page
        whose predicted return has passed, the return the residual-life law predicts now
        (``gap_estimate``: a tool in its long tail is expected to run on; a past return
        would rank it as about to be read, forever)."""
        if not isinstance(policy, AgentKvPolicy):
            return
        by_class: dict[str, float] = {}
        for view in policy.tracked():
            c = by_class.get(view.tool_class)
            if c is None:
                c = by_class[view.tool_class] = self.predictor.confidence(view.tool_class)
            view.confidence = c
            if view.last_access + view.predicted_idle_s < now:
                view.predicted_idle_s = self.predictor.gap_estimate(view, now)

    def admit_prefetch(self, rec: PageRecord, policy: EvictionPolicy, tier: Tier, codec: Codec,
                       short: int, now: float) -> list[int] | None:
        """May ``rec`` come back into HBM now, ``short`` bytes over its budget? Only by
        displacing pages it does no harm to (Cao et al.'s rule for integrated prefetching
        and caching): pages whose predicted next read comes after its own predicted read
        plus its restore time; among those, the policy's victim order (eq. 3). Returns the
        displaced pages (the policy no longer tracks them, and tracks ``rec``), or None
        when refused (nothing changes)."""
        assert isinstance(policy, AgentKvPolicy)
        self.prepare(rec, now)
        self.refresh(policy, now)
        view = rec.view
        view.tier, view.codec = tier, codec  # where it is restored from (T_move)
        read_at = view.last_access + view.predicted_idle_s
        restore_s = self.config.cost.restore_time(rec.meta.length, tier, codec)
        admission = policy.admit_prefetch(view, max(0, short), now,
                                          not_before=max(now, read_at) + restore_s)
        return list(admission.victims) if admission.admitted else None

    def observe(self, rec: PageRecord, reused: bool, now: float,
                policy: EvictionPolicy | None) -> None:
        """What the service saw of a page: read again (``reused``) or retired unread.
        Trains eq. 2 online on the page's last prediction (its features then), and tells
        the policy's return model how the page's idle gap ended (the cost-aware prefetch
        rule learns from it). Called before the access updates ``last_access``."""
        if rec.phi is not None:
            self.predictor.observe_reuse_of(rec.phi, reused)
            rec.phi = None
        if isinstance(policy, AgentKvPolicy):
            idle = max(0.0, now - rec.view.last_access)
            if reused:
                policy.observe_return(rec.view, idle)
            else:
                policy.observe_end(rec.view, idle)

    def forget(self, rec: PageRecord, policy: EvictionPolicy | None) -> None:
        """The page is erased with its tenant: its pending prediction trains nothing and
        its open idle gap leaves the return model (no outcome was seen)."""
        rec.phi = None
        if isinstance(policy, AgentKvPolicy):
            policy.forget_gap(rec.view)

    def forget_tenant(self, tenant: str) -> None:
        """``tenant`` is erased (after ``forget`` of each of its pages): its sessions' last
        tool calls go, and so does what was learned of tool classes no other tenant
        called (their names and durations); a class others call too keeps its law."""
        self._last_tool = {k: v for k, v in self._last_tool.items() if k[0] != tenant}
        others = set().union(*(t for name, t in self._tools_of.items() if name != tenant))
        for tool in self._tools_of.pop(tenant, set()) - others:
            self.predictor.tools.forget(tool)
            for policy in self._policies:
                policy.forget_tool(tool)

    def forget_session(self, tenant: str, session: str) -> None:
        """The session closed: its latest tool class goes (what was learned of the class
        stays: other sessions call it too)."""
        self._last_tool.pop((tenant, session), None)

    def learned(self) -> Learned:
        return Learned(policy=self.name, predictor=self.predictor)

    def calibration(self) -> PredictorHealth:
        cal = self.predictor.calibration
        n = len(cal)
        return PredictorHealth(
            outcomes=n, brier=cal.brier() if n else None,
            calibration_error=cal.calibration_error() if n else None,
            conservative=any(p.conservative() for p in self._policies))

    def tier_prices(self, policy: EvictionPolicy, views: list[PageView],
                    capacity: Mapping[Tier, int]) -> tuple[float, float]:
        assert isinstance(policy, AgentKvPolicy)
        return policy.tier_prices(views, capacity)

    def demotion(self, rec: PageRecord, policy: EvictionPolicy, now: float,
                 room: TierRoom | None = None) -> tuple[Tier, Codec, bool]:
        """Phase 2 of eq. 4-5 for one victim: least priced cost among the options that fit
        the free bytes of its pool's lower tiers (``room``), clamped to the forms the
        service stores."""
        assert isinstance(policy, AgentKvPolicy)
        # This service cannot re-prefill a page: the recompute-only option is priced out
        # unless no stored form fits.
        placement = policy.demotion(rec.view, room.free if room else None,
                                    room.mu if room else (0.0, 0.0), recompute=False)
        if placement.codec is Codec.RECOMPUTE:
            # No stored form fits the room left. This service cannot re-prefill, so it
            # still keeps the smallest exact-enough form: INT4, or FULL when the risk
            # controller wants a reference (one FULL copy moves fewer bytes than INT4
            # plus a FULL reference), on NVMe once the host tier is full.
            wants = policy.risk.decide(rec.view).keep_reference
            codec = Codec.FULL if wants else clamp(Codec.INT4, rec.meta.shape is not None)
            host_full = room is not None and room.free[Tier.HOST] < rec.meta.length
            return (Tier.NVME if host_full else Tier.HOST), codec, False
        codec = clamp(placement.codec, rec.meta.shape is not None)
        tier = placement.tier if placement.tier in (Tier.HOST, Tier.NVME) else Tier.HOST
        if placement.reference_tier is not None and codec is not Codec.FULL:
            return tier, *exact_form()
        return tier, codec, False

    def restore_source(self, rec: PageRecord) -> tuple[Tier, Codec]:
        """The copy with the smallest restore time L_i(k, q) under this service's costs,
        counting the fetch a lossy copy causes: ``complete_load`` serves the FULL reference
        of a lossy working copy where the page has one, so restoring the lossy copy then
        costs both moves, and a FULL copy, where there is one, is the one restored."""
        cost, n = self.config.cost, rec.meta.length
        full = rec.copies.get(Codec.FULL)
        fetch = 0.0 if full is None else cost.restore_time(n, full, Codec.FULL)
        codec = min(rec.copies, key=lambda c: (
            cost.restore_time(n, rec.copies[c], c) + (fetch if c is not Codec.FULL else 0.0),
            -int(c)))
        return rec.copies[codec], codec

    def gap_plan(self, recs: Sequence[PageRecord], event: ev.ToolStart, policy: EvictionPolicy,
                 now: float) -> tuple[list[Action], GapPlan | None]:
        assert isinstance(policy, AgentKvPolicy)
        by_id = {r.gid: r for r in recs}
        self._last_tool[(event.tenant, event.session)] = event.tool
        self._tools_of.setdefault(event.tenant, set()).add(event.tool)
        for rec in recs:
            rec.view.tool_class = event.tool
            self.prepare(rec, now)
            policy.observe_gap_start(rec.view, now)  # silent until read again or retired
        start = ToolStart(session=event.session, call_id=event.call_id, tool_class=event.tool,
                          started_at=now)
        plan = policy.on_tool_start(start, [r.view for r in recs], now)
        owner = SessionKey(event.tenant, event.session)  # its moves take its link credits
        actions = []
        for m in plan.migrations:
            rec = by_id[m.page_id]
            codec, reference = clamp(m.codec, rec.meta.shape is not None), False
            if codec is not Codec.FULL and policy.risk.decide(rec.view).keep_reference:
                codec, reference = exact_form()
            actions.append(Action(kind=ActionKind.DEMOTE, gid=m.page_id, hbm=rec.hbm,
                                  tier=m.to_tier, codec=codec, reference=reference,
                                  start_at=m.start_at, reason=Reason.GAP, session=owner))
        for f in plan.prefetches:
            rec = by_id[f.page_id]
            codec = clamp(f.codec, rec.meta.shape is not None)
            actions.append(Action(kind=ActionKind.RESTORE, gid=f.page_id, hbm=rec.hbm,
                                  tier=f.from_tier, codec=codec, start_at=f.start_at,
                                  reason=Reason.PREFETCH, session=owner))
        return actions, plan

    def prefetch_at(self, rec: PageRecord, plan: GapPlan | None, tier: Tier, codec: Codec,
                    now: float) -> float | None:
        return _agentkv_prefetch_at(self.config.cost, rec, plan, tier, codec, now)

    def tool_return(self, plan: GapPlan | None, recs: Sequence[PageRecord],
                    policy: EvictionPolicy, tool: str, started: float, now: float) -> None:
        if plan is not None and isinstance(policy, AgentKvPolicy):
            policy.on_tool_return(plan, [r.view for r in recs], now)
        else:
            self.predictor.observe_tool(tool, max(now - started, 1e-6))


def _agentkv_prefetch_at(cost: CostModel, rec: PageRecord, plan: GapPlan | None, tier: Tier,
                         codec: Codec, now: float) -> float | None:
    """When a page pushed out during its session's tool call should start coming back:
    its restore time before the plan's predicted return (at once if that has passed)."""
    if plan is None:
        return None
    return max(now, plan.predicted_return - cost.restore_time(rec.meta.length, tier, codec))


def make_strategy(name: str, learned: Learned | None = None) -> Strategy:
    """The strategy ``name``; ``learned`` (from an earlier controller of the same policy)
    carries what that one learned."""
    if learned is not None and learned.policy != name:
        raise ValueError(f"learned state of {learned.policy!r} given to {name!r}")
    if name == "lru":
        return LruStrategy()
    if name == "agentkv":
        return AgentKvStrategy(learned=learned)
    raise ValueError(f"unknown policy {name!r}; expected 'agentkv' or 'lru'")


__all__ = ["AgentKvStrategy", "Learned", "LruStrategy", "Strategy", "make_strategy"]
