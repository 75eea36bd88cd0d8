"""The AgentKV policy: value model (eq. 3) + risk control + placement + tool-gap planning.

As an ``EvictionPolicy`` it evicts the lowest value density first, keeps pages
the risk controller protects (high value under a low-confidence prediction)
until last, and tells the caller in which form a victim should be kept
(``demotion``). When the resident pages' mean prediction confidence is below
the threshold it falls back to the conservative policy: LRU order and
full-precision demotion. ``Mechanisms`` switches give the Table 5 ablations.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from agentkv_cluster.policy.base import (
    CostModel,
    DuplicatePage,
    EarlyReturnReport,
    EndOfLife,
    GapPlan,
    InvalidPageView,
    Mechanisms,
    PageId,
    PageView,
    Placement,
    PrefetchAdmission,
    RetireDecision,
    ToolStart,
)
from agentkv_cluster.policy.baselines import TrackedPolicy, take_exactly
from agentkv_cluster.policy.columns import RowStore
from agentkv_cluster.policy.confidence_gate import ConfidenceGate
from agentkv_cluster.policy.gap import GapConfig, GapPlanner
from agentkv_cluster.policy.order import KeyedHeap, NowOrder
from agentkv_cluster.policy.placement import PlacementConfig, PlacementPlanner
from agentkv_cluster.policy.placement_costs import OPTIONS, OptionCosts
from agentkv_cluster.policy.predictor import Predictor, PredictorConfig
from agentkv_cluster.policy.returns import ReturnConfig, ReturnModel
from agentkv_cluster.policy.risk import RiskConfig, RiskController
from agentkv_cluster.policy.value import PROFILES, PageColumns, ValueModel, ValueProfile
from store.types import Codec, Tier

_UNLIMITED = 1 << 62
# From this many resident pages the victim order is computed over numpy columns;
# below it the per-page path is faster (numpy's fixed cost per call dominates).
_COLUMNAR_MIN_PAGES = 256
# the PageView fields of the victim order, as kept rows (``_key_columns``)
_KEY_FIELDS = ("reuse", "recompute_s", "dependency", "correctness", "idle_s", "last_access",
               "confidence", "size")
_NO_COLUMN = np.zeros(0)


@dataclass(frozen=True, kw_only=True)
class AgentKvConfig:
    profile: ValueProfile = PROFILES["balanced"]
    cost: CostModel = field(default_factory=CostModel)
    mechanisms: Mechanisms = field(default_factory=Mechanisms)
    risk: RiskConfig = field(default_factory=RiskConfig)
    gap: GapConfig = field(default_factory=GapConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    returns: ReturnConfig = field(default_factory=ReturnConfig)
    fixed_codec: Codec = Codec.INT8  # the only lossy form when adaptive_precision is off


def allowed_codecs(config: AgentKvConfig) -> tuple[Codec, ...]:
    """Codecs a demoted working copy may take under the enabled mechanisms."""
    mech = config.mechanisms
    if not mech.reversible_compression:
        return (Codec.FULL,)
    if not mech.adaptive_precision:
        return (config.fixed_codec,)
    return (Codec.FULL, Codec.INT8, Codec.INT4, Codec.LOW_RANK)


class AgentKvPolicy(TrackedPolicy):
    """Composes the policy modules; its own logic is the victim order and the two
    rules that follow from it (prefetch admission, retirement on the event graph's
    signal)."""

    name = "agentkv"

    def __init__(self, config: AgentKvConfig | None = None,
                 predictor: Predictor | None = None, returns: ReturnModel | None = None
                 ) -> None:
        super().__init__()
        cfg = config or AgentKvConfig()
        mech = cfg.mechanisms
        self.config = cfg
        self.predictor = predictor or Predictor(cfg.predictor)
        self.returns = returns or ReturnModel(cfg.returns)
        self.value_model = ValueModel(cfg.profile, cfg.cost, use_dependency=mech.event_dependency)
        self.risk = RiskController(replace(cfg.risk, enabled=mech.risk_control))
        codecs = allowed_codecs(cfg)
        self.placement = PlacementPlanner(self.value_model, self.risk,
                                          PlacementConfig(allowed_codecs=codecs))
        gap_codec = cfg.gap.codec if mech.adaptive_precision else cfg.fixed_codec
        self.gap = GapPlanner(cfg.cost, self.predictor, self.value_model, self.risk,
                              replace(cfg.gap, prefetch=mech.gap_prefetch,
                                      codec=gap_codec if mech.reversible_compression
                                      else Codec.FULL), returns=self.returns)
        self._costs = OptionCosts(cfg.cost, cfg.profile.lam, codecs)
        self._safest_codec = min(codecs)  # the conservative fallback's working-copy form
        # The victim order kept between calls (``order``): rows of the key fields, the
        # order at one ``now``, the conservative LRU order, the fallback test. They
        # hold the records as last reported (on_insert / on_access / on_update).
        self._rows = RowStore(_KEY_FIELDS)
        self._by_density = NowOrder(self._rows, self._key_columns)
        self._by_access = KeyedHeap()
        self._gate = ConfidenceGate()
        self._live = False  # records handed out by ``tracked``: read live until told
        self._resync = False  # rebuild the kept structures from the records first

    # ------------------------------------------------------------ eviction
    def conservative(self) -> bool:
        """True when predictions are not trusted: LRU order, full-precision demotion.
        Read from the records as they are now (a caller may have refreshed them in
        place); the policy's own decisions use the kept total (``_conservative``)."""
        conf = [p.confidence for p in self._pages.values() if not p.pinned]
        return bool(conf) and sum(conf) / len(conf) < self.config.predictor.confidence_threshold

    def _conservative(self) -> bool:
        """``conservative`` from the kept exact total of the records as last reported
        (``confidence_gate``); read live while records are handed out, or when the
        total cannot tell which side of the threshold the float mean falls on."""
        if not self._live:
            self._sync()
            below = self._gate.below(self.config.predictor.confidence_threshold)
            if below is not None:
                return below
        return self.conservative()

    def rank_key(self, page: PageView, now: float, conservative: bool | None = None
                 ) -> tuple[float | bool, ...]:
        """The page's place in the victim order (lower goes first): risk-protected
        pages last, then value density (eq. 3 at ``now``), older access first; in
        the conservative fallback plain LRU."""
        if self.conservative() if conservative is None else conservative:
            return (page.last_access, page.page_id)
        protected = not self.risk.guard_demotion(page)
        return (protected, self.value_model.density(page, now), page.last_access, page.page_id)

    def tracked(self) -> Iterator[PageView]:
        """The tracked records, for a refresh in place: until the policy is next told
        of a page (on_insert / on_access / on_update / a removal) it reads every record
        live, as a full sort does; then it rebuilds its kept order from them once."""
        self._live = True
        return super().tracked()

    def set_confidence(self, confidence: float) -> None:
        """Every tracked record's prediction confidence is now ``confidence`` (a driver's
        periodic refresh): the records and the kept structures in one pass. A refresh
        through ``tracked`` makes the next change rebuild all of them from the records."""
        if not 0.0 <= confidence <= 1.0:  # (NaN too)
            raise InvalidPageView(f"confidence={confidence} outside [0, 1]")
        for page in self._pages.values():
            page.confidence = confidence
        if self._live or self._resync:
            return  # read live, or rebuilt from the records before the next use
        self._rows.cols["confidence"][self._rows.rows()] = confidence
        self._gate.set_all(confidence)
        self._by_density.invalidate()

    def _victim_walk(self, now: float) -> Iterable[PageId]:
        """``_victim_order``, read from the kept structures (``order``): the LRU heap in
        the conservative fallback, the order kept for ``now`` from 256 pages."""
        if self._live:
            return self._victim_order(now)
        self._sync()
        if self._conservative():
            if not self._by_access.has_nan:
                return self._by_access.ordered()
        elif len(self._pages) >= _COLUMNAR_MIN_PAGES:
            kept = self._by_density.ordered(now, self._model_token())
            if kept is not None:
                return kept
        return self._victim_order(now)

    def _order_done(self) -> None:
        self._by_access.restore()
        self._by_density.restore()

    def _model_token(self) -> tuple[object, ...]:
        """What the density order depends on beyond the records and ``now``."""
        vm, risk = self.value_model, self.risk
        return (id(vm), vm.profile, vm.use_dependency, vm._move_fixed, vm._move_per_byte,
                id(risk), risk.config)

    def _key_columns(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, ...]:
        """``_columnar_order``'s keys (protected, density, last access) of kept rows."""
        c = self._rows.cols
        cols = PageColumns(
            page_ids=self._rows.ids[rows], size=c["size"][rows], reuse=c["reuse"][rows],
            recompute_s=c["recompute_s"][rows], dependency=c["dependency"][rows],
            correctness=c["correctness"][rows], idle_s=c["idle_s"][rows],
            pinned=_NO_COLUMN, type_idx=_NO_COLUMN, structured=_NO_COLUMN,
            last_access=c["last_access"][rows], confidence=c["confidence"][rows])
        return (self._protected(cols), self.value_model.densities(cols, now),
                cols.last_access)

    def _protected(self, cols: PageColumns) -> np.ndarray:
        """``not risk.guard_demotion`` over columns."""
        rc = self.risk.config
        if not rc.enabled:
            return np.zeros(len(cols.page_ids), dtype=np.bool_)
        high = (cols.correctness >= rc.protect_weight) | (cols.dependency > 0.0)
        return high & (cols.confidence < rc.low_confidence)

    # -- the kept structures follow every reported change
    def _inserted(self, page: PageView, now: float) -> None:
        self._keep(page)

    def _refreshed(self, page: PageView) -> None:
        self._keep(page)

    def _removed(self, page_id: PageId) -> None:
        if self._told():
            return
        self._rows.drop(page_id)
        self._by_density.touch(page_id)
        self._by_access.discard(page_id)
        self._gate.drop(page_id)

    def _keep(self, page: PageView) -> None:
        if self._told():
            return
        pid = page.page_id
        self._rows.put(pid, (page.reuse_prob, page.recompute_cost_s, page.dependency,
                             page.correctness_weight, page.predicted_idle_s,
                             page.last_access, page.confidence, float(page.size_bytes)))
        self._by_density.touch(pid)
        self._by_access.put((page.last_access, pid))
        self._gate.put(pid, page.confidence, not page.pinned)

    def _told(self) -> bool:
        """A change is reported: leave live reading; True while a rebuild is due."""
        if self._live:
            self._live, self._resync = False, True
        return self._resync

    def _sync(self) -> None:
        if not self._resync:
            return
        self._resync = False
        self._rows.clear()
        self._by_density.invalidate()
        self._by_access.clear()
        self._gate.clear()
        for page in self._pages.values():
            self._keep(page)

    def _victim_order(self, now: float) -> list[PageId]:
        """Every tracked page in victim order, sorted afresh from the records."""
        pages = list(self._pages.values())
        if self._conservative():
            return [p.page_id for p in sorted(pages, key=lambda p: (p.last_access, p.page_id))]
        if len(pages) >= _COLUMNAR_MIN_PAGES:
            return self._columnar_order(pages, now)
        guard, density = self.risk.guard_demotion, self.value_model.density
        return [p.page_id for p in sorted(pages, key=lambda p: (
            not guard(p), density(p, now), p.last_access, p.page_id))]

    def _columnar_order(self, pages: list[PageView], now: float) -> list[PageId]:
        """``rank_key`` order over numpy columns (large resident sets)."""
        cols = PageColumns.from_pages(pages)
        density = self.value_model.densities(cols, now)
        order = np.lexsort((cols.page_ids, cols.last_access, density, self._protected(cols)))
        return cols.page_ids[order].tolist()

    def admit_prefetch(self, page: PageView, need_bytes: int, now: float, *,
                       not_before: float | None = None) -> PrefetchAdmission:
        """May a prefetched ``page`` enter the fast tier? It may only displace pages the
        victim order ranks below it (else prefetches push each other out in cycles):
        admitted with exactly enough such victims, which stop being tracked, or not
        admitted and nothing changes. ``need_bytes``: bytes short of room for it.
        With ``not_before`` (the "do no harm" rule of integrated prefetching and
        caching) it may instead displace only pages whose predicted next read
        (``last_access + predicted_idle_s``) is no earlier than ``not_before``, in
        victim order: with time-ordered victims no two prefetches can displace each
        other in turn.
        Once the return model has learned from enough gap outcomes, the prefetch must
        also still pay at ``now`` (``GapPlanner.worth_prefetching``: P(read again |
        silent until now) against the link time and the ``need_bytes`` it displaces);
        otherwise it is refused and nothing changes."""
        page.validate()
        if page.page_id in self._pages:
            raise DuplicatePage(f"{self.name}: page {page.page_id} is already tracked")
        if self.returns.trained and not self.gap.worth_prefetching(
                page, now, restore_s=self.config.cost.restore_time(
                    page.size_bytes, page.tier, page.codec),
                displaced_bytes=max(0, need_bytes)):
            return PrefetchAdmission(page_id=page.page_id, admitted=False, victims=())
        victims: list[PageId] = []
        if need_bytes > 0:
            conservative = self.conservative()
            if not_before is None:
                mine = self.rank_key(page, now, conservative)
                below = [p for p in self._pages.values()
                         if self.rank_key(p, now, conservative) < mine]
            else:
                below = [p for p in self._pages.values()
                         if p.last_access + p.predicted_idle_s >= not_before]
            below.sort(key=lambda p: self.rank_key(p, now, conservative))
            victims = take_exactly((p.page_id for p in below), self._pages, need_bytes)
            if not victims:
                return PrefetchAdmission(page_id=page.page_id, admitted=False, victims=())
            for pid in victims:
                self._bytes -= self._pages.pop(pid).size_bytes
                self._evicted(pid)
        self.on_insert(page, now)
        return PrefetchAdmission(page_id=page.page_id, admitted=True, victims=tuple(victims))

    def on_consumers_done(self, page: PageView, now: float, *, retirable: bool = True,
                          signal: EndOfLife = EndOfLife.TASK_END) -> RetireDecision:
        """Event dependency: once every reachable consumer is done and the event graph
        finds no other blocker (``retirable``: rollback, audit, generation), the page
        is retired from every tier. Without the mechanism (ablation) it only loses
        its dependency weight and stays until evicted."""
        if self.config.mechanisms.event_dependency and retirable:
            if page.page_id in self._pages:
                self.on_remove(page.page_id)
            return RetireDecision(page_id=page.page_id, retire=True,
                                  reason="no unfinished consumer; retirable")
        if page.page_id in self._pages:
            self.on_update(page, now)
        reason = ("event dependency off" if retirable
                  else "consumers done; the event graph still blocks retirement")
        return RetireDecision(page_id=page.page_id, retire=False, reason=reason)

    def demotion(self, page: PageView, free: Mapping[Tier, int] | None = None,
                 mu: tuple[float, float] = (0.0, 0.0), recompute: bool = True) -> Placement:
        """Where and in what form to keep an evicted page (phase 2 of the planner, one page):
        the option of least cost (eq. 4) that fits ``free`` per lower tier, each byte priced
        at the tier's capacity price ``mu`` (HOST, NVME; see ``tier_prices``). With
        ``recompute`` False (a caller whose engine cannot re-prefill the page) the
        recompute-only option is chosen only when no stored form fits."""
        room = {Tier.HOST: _UNLIMITED, Tier.NVME: _UNLIMITED, **(free or {})}
        decision = self.risk.decide(page)
        max_codec = self._safest_codec if self._conservative() else decision.max_lossy_codec
        k, stored, ref = self._costs.best_single(
            size=page.size_bytes, reuse=page.reuse_prob, recompute_s=page.recompute_cost_s,
            correctness=page.correctness_weight, keep_ref=decision.keep_reference,
            max_codec=max_codec, mu=mu, free=room, recompute=recompute)
        tier, codec = OPTIONS[k]
        return Placement(page_id=page.page_id, tier=tier, codec=codec, stored_bytes=stored,
                         reference_tier=Tier.NVME if ref else None, reference_bytes=ref)

    def tier_prices(self, pages: Sequence[PageView], capacity: Mapping[Tier, int]
                    ) -> tuple[float, float]:
        """Capacity prices (mu_HOST, mu_NVME) of eq. 5 for the lower tiers: the least
        prices per byte at which the phase-2 choices of ``pages`` (the pages kept in
        those tiers) fit ``capacity``; (0, 0) while everything fits."""
        if not pages:
            return (0.0, 0.0)
        conservative = self.conservative()
        decisions = [self.risk.decide(p) for p in pages]
        max_codec = np.array([int(self._safest_codec if conservative else d.max_lossy_codec)
                              for d in decisions])
        rows = self._costs.rows([p.size_bytes for p in pages], [p.reuse_prob for p in pages],
                                [p.recompute_cost_s for p in pages],
                                [p.correctness_weight for p in pages],
                                [d.keep_reference for d in decisions], max_codec)
        return rows.prices(capacity, sample=256, iters=16)

    # ------------------------------------------------------------ gap outcomes
    def observe_return(self, page: PageView, idle_s: float) -> None:
        """The page was read again after ``idle_s`` of silence (the return model learns)."""
        self.returns.observe_return(page, idle_s)

    def observe_end(self, page: PageView, silent_s: float) -> None:
        """The page's end-of-life signal came after ``silent_s`` of silence."""
        self.returns.observe_end(page, silent_s)

    def observe_gap_start(self, page: PageView, now: float) -> None:
        """The page began an idle gap at ``now`` (an open gap for the return model)."""
        self.returns.open_gap(page, now)

    def forget_gap(self, page: PageView) -> None:
        """The page is gone without an outcome (tenant erasure): drop its open gap."""
        self.returns.forget(page.page_id)

    def forget_tool(self, tool_class: str) -> None:
        """The only tenant that called ``tool_class`` was erased: its return outcomes go."""
        self.returns.forget_tool(tool_class)

    # ------------------------------------------------------------ tool gaps
    def on_tool_start(self, tool_start: ToolStart, pages: Sequence[PageView],
                      now: float) -> GapPlan:
        return self.gap.plan(tool_start, pages, now)

    def on_tool_return(self, plan: GapPlan, pages: Sequence[PageView],
                       now: float) -> EarlyReturnReport:
        """Feed the observed duration to the predictor; cancel what is still unfinished."""
        start = plan.tool_start
        if now > start.started_at:
            self.predictor.observe_tool(start.tool_class, now - start.started_at)
        return self.gap.early_return(plan, pages, now)
