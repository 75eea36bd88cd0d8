"""Driver around ``AgentKvPolicy``: its value order, its demotion form, its gap plans.

Composition only. A victim's form comes from ``AgentKvPolicy.demotion`` (phase 2
of the placement planner under the risk decision). Its prefetch comes from the
gap planner: the victim's idle period is the tool call it waits on, so the loop
asks ``on_tool_start`` for that one page and starts the planned prefetch, if
the plan has one; whether the landing prefetch may displace resident pages is
``AgentKvPolicy.admit_prefetch``. Retirement on the end-of-life signal is
``AgentKvPolicy.on_consumers_done`` (called by the loop).

What AgentKV knows it learned: the predictor learns tool durations from every
observed gap (the trace's own tool duration where the workload has one, else
the whole idle gap) and reuse from every read (reused) and every end-of-life
signal (not reused, even when the signal was false); each page's
``reuse_prob`` is the predictor's estimate, refreshed at creation and at each
new gap. Recompute costs are the cost model's estimates (``PageFactory``).
Its return model (``policy.returns``) learns how each idle gap ended: a gap opens
at production and at each read, and closes at the next read (a return) or at the
end-of-life signal (an end); gaps still open when the batch's events run out close
as ends. It decides whether a gap prefetch pays.
"""

from __future__ import annotations

import math
from collections import deque

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy
from agentkv_cluster.policy.base import Mechanisms, PageView, PrefetchAdmission, ToolStart
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.policy.returns import ReturnModel
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import Demotion, PageFactory, cost_model, retype_view
from store.types import Codec, Tier

CONFIDENCE_REFRESH = 64  # outcomes between refreshes of resident pages' confidence


class PredictionSkill:
    """How far the idle-gap predictions the pages carry can be trusted, learned from
    the reads seen so far: data volume n / (n + prior) times 1 - mean |log error| /
    ``error_scale`` over a window (a log error of ``error_scale`` or worse: no skill).

    In the simulator the gap predictions come from the workload's predictor model
    (true gap x log-normal error, shared with TTL), not from ``Predictor``'s tool
    law, so the confidence gate measures their observed quality; the reuse part of
    the gate is the predictor's own calibration (``Predictor.calibration``).
    """

    def __init__(self, prior: int = 16, window: int = 2048, error_scale: float = 1.5) -> None:
        self.prior, self.error_scale = prior, error_scale
        self._errors: deque[float] = deque(maxlen=window)
        self._sum = 0.0
        self.n = 0

    def observe(self, predicted_s: float, actual_s: float) -> None:
        if predicted_s <= 0 or actual_s <= 0:
            return
        err = abs(math.log(actual_s / predicted_s))
        if len(self._errors) == self._errors.maxlen:
            self._sum -= self._errors[0]
        self._errors.append(err)
        self._sum += err
        self.n += 1

    def confidence(self) -> float:
        if not self._errors:
            return 0.0
        data = self.n / (self.n + self.prior)
        return data * max(0.0, 1.0 - (self._sum / len(self._errors)) / self.error_scale)


class AgentKvDriver:
    def __init__(self, cfg: SimConfig, mechanisms: Mechanisms, predictor: Predictor,
                 skill: PredictionSkill | None = None,
                 returns: ReturnModel | None = None) -> None:
        self.skill = skill or PredictionSkill()
        self.cost = cost_model(cfg)
        self.policy = AgentKvPolicy(AgentKvConfig(cost=self.cost, mechanisms=mechanisms),
                                    predictor=predictor, returns=returns)
        self.name = self.policy.name
        self._views = PageFactory()
        self._phi: dict[int, object] = {}  # page -> features of its open reuse prediction
        self._outcomes = 0

    def make_view(self, **fields: object) -> PageView:
        view = self._views.make_view(**fields)  # type: ignore[arg-type]
        self._estimate(view, view.created)
        return view

    def produced(self, page: PageView, now: float) -> None:
        self.policy.observe_gap_start(page, now)

    def finish(self, now: float) -> None:
        """The batch is over: pages still silent were never read again."""
        self.policy.returns.close_open_gaps(now)

    def _estimate(self, view: PageView, now: float) -> None:
        """The predictor's reuse estimate and its own confidence for the tool class
        (data volume, calibration): below its threshold AgentKvPolicy falls back to
        its conservative order."""
        pred = self.policy.predictor
        phi = pred.features(view, now)
        self._phi[view.page_id] = phi
        view.reuse_prob = pred.reuse.predict(phi)
        view.confidence = self._confidence()

    def _outcome(self, view: PageView, reused: bool) -> None:
        phi = self._phi.pop(view.page_id, None)
        if phi is not None:
            self.policy.predictor.observe_reuse_of(phi, reused)  # type: ignore[arg-type]
        self._outcomes += 1
        if self._outcomes % CONFIDENCE_REFRESH == 0:
            self._refresh_confidence()

    def _refresh_confidence(self) -> None:
        """Resident pages carry the predictor's confidence as of their last estimate; a
        page never read again would keep its creation-time (untrained) confidence and
        hold the policy in its conservative fallback. The service refreshes it before
        each decision (``prepare``); here every CONFIDENCE_REFRESH outcomes."""
        self.policy.set_confidence(self._confidence())

    def _confidence(self) -> float:
        """min(skill of the gap predictions, calibration of the reuse estimates)."""
        cal = self.policy.predictor.calibration
        reuse = (max(0.0, 1.0 - cal.calibration_error() / 0.25) if len(cal) >= 32 else 1.0)
        return min(self.skill.confidence(), reuse)

    def demote(self, page: PageView, now: float) -> Demotion:
        p = self.policy.demotion(page)
        return Demotion(tier=p.tier, codec=p.codec, stored_bytes=p.stored_bytes,
                        reference=p.reference_tier is not None)

    def prefetch_at(self, page: PageView, demotion: Demotion, now: float,
                    tool_started: float | None = None) -> float | None:
        if demotion.codec is Codec.RECOMPUTE:
            return None  # nothing stored to bring back
        started = page.last_access if tool_started is None else tool_started
        start = ToolStart(session=page.session, call_id=str(page.page_id),
                          tool_class=page.tool_class, started_at=started)
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

    def observe_read(self, page: PageView, idle_s: float, tool_s: float, now: float) -> None:
        pred = self.policy.predictor
        duration = tool_s if tool_s > 0 else idle_s
        if duration > 0:
            pred.observe_tool(page.tool_class, duration)
        self.skill.observe(page.predicted_idle_s, idle_s)
        self.policy.observe_return(page, max(0.0, idle_s))
        self._outcome(page, True)

    def observe_end(self, page: PageView, now: float) -> None:
        self.policy.observe_end(page, max(0.0, now - page.last_access))
        self._outcome(page, False)

    def retype(self, page: PageView, state_type: StateType, now: float) -> None:
        """The new type enters the reuse estimate at the page's next gap (``enter_gap``):
        the gap now ending is scored against the features it began with."""
        retype_view(page, state_type, keep_reuse=True)

    def enter_gap(self, page: PageView, tool_class: str, now: float) -> None:
        if tool_class:
            page.tool_class = tool_class
        self._estimate(page, now)
        self.policy.observe_gap_start(page, now)


__all__ = ["AgentKvDriver", "Tier"]
