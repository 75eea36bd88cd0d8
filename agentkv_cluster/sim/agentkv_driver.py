"""Driver around ``AgentKvPolicy``: its value order, its demotion form, its gap plans.

Composition only. A victim's form comes from ``AgentKvPolicy.demotion`` (phase 2
of the placement planner under the risk decision). Its prefetch comes from the
gap planner: the victim's idle period is the tool call it waits on, so the loop
asks ``on_tool_start`` for that one page and starts the planned prefetch, if
the plan has one; whether the landing prefetch may displace resident pages is
``AgentKvPolicy.admit_prefetch``. Retirement on the end-of-life signal is
``AgentKvPolicy.on_consumers_done`` (called by the loop). The predictor learns
tool durations from every observed read.
"""

from __future__ import annotations

from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy
from agentkv_cluster.policy.base import Mechanisms, PageView, PrefetchAdmission, ToolStart
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.policy.risk import RiskController
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import Demotion, PageFactory, cost_model
from store.types import Codec, Tier


class AgentKvDriver:
    def __init__(self, cfg: SimConfig, mechanisms: Mechanisms, predictor: Predictor) -> None:
        self.cost = cost_model(cfg)
        self.policy = AgentKvPolicy(AgentKvConfig(cost=self.cost, mechanisms=mechanisms),
                                    predictor=predictor)
        self.name = self.policy.name
        self.risk_controller = RiskController()  # the metric, identical for every policy
        self._views = PageFactory(cfg)

    def make_view(self, **fields: object) -> PageView:
        view = self._views.make_view(**fields)  # type: ignore[arg-type]
        # The predictor's own confidence for the tool class (data volume, calibration):
        # below its threshold AgentKvPolicy falls back to its conservative order.
        view.confidence = self.policy.predictor.confidence(view.tool_class)
        return view

    def demote(self, page: PageView, now: float) -> Demotion:
        p = self.policy.demotion(page)
        return Demotion(tier=p.tier, codec=p.codec, stored_bytes=p.stored_bytes,
                        reference=p.reference_tier is not None)

    def prefetch_at(self, page: PageView, demotion: Demotion, now: float) -> float | None:
        if demotion.codec is Codec.RECOMPUTE:
            return None  # nothing stored to bring back
        start = ToolStart(session=page.session, call_id=str(page.page_id),
                          tool_class=page.tool_class, started_at=page.last_access)
        plan = self.policy.on_tool_start(start, [page], now)
        for f in plan.prefetches:
            if f.page_id == page.page_id:
                return f.start_at
        return None

    def admit_prefetch(self, page: PageView, need_bytes: int, now: float) -> PrefetchAdmission:
        return self.policy.admit_prefetch(page, need_bytes, now)

    def restore_s(self, page: PageView, demotion: Demotion) -> float:
        if demotion.codec is Codec.RECOMPUTE:
            return page.recompute_cost_s
        return self.cost.restore_time(page.size_bytes, demotion.tier, demotion.codec)

    def observe_read(self, page: PageView, idle_s: float) -> None:
        if idle_s > 0:
            self.policy.predictor.observe_tool(page.tool_class, idle_s)

    def risk(self, page: PageView, demotion: Demotion, predicted_idle_s: float,
             actual_idle_s: float) -> float:
        return self.risk_controller.risk_proxy(
            page, tier=demotion.tier, codec=demotion.codec,
            predicted_idle_s=max(predicted_idle_s, 1e-9), actual_idle_s=max(actual_idle_s, 1e-9))


__all__ = ["AgentKvDriver", "Tier"]
