"""The AgentKV policy: value model (eq. 3) + risk control + placement + tool-gap planning.

As an ``EvictionPolicy`` it evicts the lowest value density first, keeps pages
the risk controller protects (high value under a low-confidence prediction)
until last, and tells the caller in which form a victim should be kept
(``demotion``). When the resident pages' mean prediction confidence is below
the threshold it falls back to the conservative policy: LRU order and
full-precision demotion. ``Mechanisms`` switches give the Table 5 ablations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from agentkv_cluster.policy.base import (
    CostModel,
    EarlyReturnReport,
    GapPlan,
    Mechanisms,
    PageId,
    PageView,
    Placement,
    ToolStart,
)
from agentkv_cluster.policy.baselines import TrackedPolicy
from agentkv_cluster.policy.gap import GapConfig, GapPlanner
from agentkv_cluster.policy.placement import PlacementConfig, PlacementPlanner
from agentkv_cluster.policy.placement_costs import OPTIONS, OptionCosts
from agentkv_cluster.policy.predictor import Predictor, PredictorConfig
from agentkv_cluster.policy.risk import RiskConfig, RiskController
from agentkv_cluster.policy.value import PROFILES, ValueModel, ValueProfile
from store.types import Codec, Tier

_UNLIMITED = 1 << 62


@dataclass(frozen=True, kw_only=True)
class AgentKvConfig:
    profile: ValueProfile = PROFILES["balanced"]
    cost: CostModel = field(default_factory=CostModel)
    mechanisms: Mechanisms = field(default_factory=Mechanisms)
    risk: RiskConfig = field(default_factory=RiskConfig)
    gap: GapConfig = field(default_factory=GapConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
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
    """Composes the policy modules; holds no logic of its own beyond the victim order."""

    name = "agentkv"

    def __init__(self, config: AgentKvConfig | None = None,
                 predictor: Predictor | None = None) -> None:
        super().__init__()
        cfg = config or AgentKvConfig()
        mech = cfg.mechanisms
        self.config = cfg
        self.predictor = predictor or Predictor(cfg.predictor)
        self.value_model = ValueModel(cfg.profile, cfg.cost, use_dependency=mech.event_dependency)
        self.risk = RiskController(replace(cfg.risk, enabled=mech.risk_control))
        codecs = allowed_codecs(cfg)
        self.placement = PlacementPlanner(self.value_model, self.risk,
                                          PlacementConfig(allowed_codecs=codecs))
        gap_codec = cfg.gap.codec if mech.adaptive_precision else cfg.fixed_codec
        self.gap = GapPlanner(cfg.cost, self.predictor, self.value_model, self.risk,
                              replace(cfg.gap, prefetch=mech.gap_prefetch,
                                      codec=gap_codec if mech.reversible_compression
                                      else Codec.FULL))
        self._costs = OptionCosts(cfg.cost, cfg.profile.lam, codecs)
        self._safest_codec = min(codecs)  # the conservative fallback's working-copy form

    # ------------------------------------------------------------ eviction
    def conservative(self) -> bool:
        """True when predictions are not trusted: LRU order, full-precision demotion."""
        pages = [p for p in self._pages.values() if not p.pinned]
        if not pages:
            return False
        mean = sum(p.confidence for p in pages) / len(pages)
        return mean < self.config.predictor.confidence_threshold

    def _victim_order(self, now: float) -> list[PageId]:
        pages = list(self._pages.values())
        if self.conservative():
            return [p.page_id for p in sorted(pages, key=lambda p: (p.last_access, p.page_id))]

        def key(page: PageView) -> tuple[bool, float, float, PageId]:
            protected = not self.risk.guard_demotion(page)
            return (protected, self.value_model.density(page), page.last_access, page.page_id)

        return [p.page_id for p in sorted(pages, key=key)]

    def demotion(self, page: PageView, free: Mapping[Tier, int] | None = None) -> Placement:
        """Where and in what form to keep an evicted page (phase 2 of the planner, one page)."""
        room = {Tier.HOST: _UNLIMITED, Tier.NVME: _UNLIMITED, **(free or {})}
        decision = self.risk.decide(page)
        max_codec = self._safest_codec if self.conservative() else decision.max_lossy_codec
        k, stored, ref = self._costs.best_single(
            size=page.size_bytes, reuse=page.reuse_prob, recompute_s=page.recompute_cost_s,
            correctness=page.correctness_weight, keep_ref=decision.keep_reference,
            max_codec=max_codec, mu=(0.0, 0.0), free=room)
        tier, codec = OPTIONS[k]
        return Placement(page_id=page.page_id, tier=tier, codec=codec, stored_bytes=stored,
                         reference_tier=Tier.NVME if ref else None, reference_bytes=ref)

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
