"""Thin adapters between the event loop and the policy classes of ``agentkv_cluster.policy``.

A driver owns one ``EvictionPolicy`` and answers the questions the loop asks
around it: where and in what form does a victim go, when (if ever) does its
prefetch start, may a landing prefetch displace resident pages, and how long
does a restore take. Every answer is delegated to a policy object (placement,
risk, gap planner, cost model); the drivers hold no decision logic of their
own. The end-of-life signal goes to ``policy.on_consumers_done`` directly.

A ``PageView`` is filled from observables only (``PageFactory``): the reuse
probability is the lifecycle prior of the page's type (AgentKV's driver then
overwrites it with its predictor's estimate), the recompute cost is the cost
model's estimate (``Batch.recompute_est_s``, with its own error), the correctness
weight is the type's prior. The workload's true reuse rates, recompute times and
weights never reach a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType
from agentkv_cluster.policy.base import CostModel, EvictionPolicy, PageView, PrefetchAdmission
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.workload import TYPE_ORDER, Batch
from store.types import Codec, Tier


@dataclass(frozen=True, slots=True)
class Demotion:
    """Where a victim went: its working copy and whether a full reference exists."""

    tier: Tier
    codec: Codec
    stored_bytes: int  # bytes that cross the link on restore
    reference: bool = False  # a FULL reference copy is kept in a lower tier


class PolicyDriver(Protocol):
    """``views_on_demand`` (optional, default False): True when ``make_view`` reads
    nothing the driver learns, so the loop may make each view when its page is
    produced; otherwise it makes every view at the batch's start."""

    name: str
    policy: EvictionPolicy

    def make_view(self, **fields: object) -> PageView: ...

    def demote(self, page: PageView, now: float) -> Demotion: ...

    def prefetch_at(self, page: PageView, demotion: Demotion, now: float,
                    tool_started: float | None = None) -> float | None: ...

    def admit_prefetch(self, page: PageView, need_bytes: int,
                       now: float) -> PrefetchAdmission: ...

    def restore_s(self, page: PageView, demotion: Demotion) -> float: ...

    def observe_read(self, page: PageView, idle_s: float, tool_s: float, now: float) -> None:
        """A read after ``idle_s`` idle seconds, of which the tool ran ``tool_s`` (0 = unknown)."""

    def observe_end(self, page: PageView, now: float) -> None:
        """An end-of-life signal (true or not) reached the page."""

    def enter_gap(self, page: PageView, tool_class: str, now: float) -> None:
        """The page starts a new idle gap waiting on ``tool_class`` ("" = unknown)."""

    def retype(self, page: PageView, state_type: StateType, now: float) -> None:
        """The page's type changed at ``now`` (``Batch.retype_at``); ``retype_view``."""

    def produced(self, page: PageView, now: float) -> None:
        """The page was produced at ``now`` (its first idle gap begins)."""

    def finish(self, now: float) -> None:
        """The batch's last event happened at ``now``."""


def retype_view(view: PageView, state_type: StateType, keep_reuse: bool = False) -> None:
    """The page's type changed: its view takes the type and its Table 1 correctness
    weight, and its reuse prior unless ``keep_reuse`` (a driver with its own estimate,
    made again at the next gap). The recompute estimate and tool class stay, as in the
    service (``runtime/tuning.py`` ``set_type``, where the cost follows the type's
    prior: here it is the cost model's estimate of the page)."""
    prior = TYPE_DEFAULTS[state_type]
    view.state_type, view.correctness_weight = state_type, prior.correctness_weight
    if not keep_reuse:
        view.reuse_prob = prior.reuse_prob


def retype_due(batch: Batch, driver: PolicyDriver, view: PageView, now: float) -> None:
    """Tell ``driver`` of the type change of ``view``'s page due by ``now``, if any."""
    if batch.retype_at is None or batch.retype_to is None or \
            now < batch.retype_at[view.page_id]:
        return
    state_type = TYPE_ORDER[int(batch.retype_to[view.page_id])]
    if view.state_type is not state_type:
        driver.retype(view, state_type, now)


def cost_model(cfg: SimConfig) -> CostModel:
    """The policy layer's cost model, set to the simulated hardware.

    The paper's 3.2:1 is an effective ratio that already includes compress and
    decompress time, so codec time is folded into the ratio (infinite codec
    throughput) rather than counted twice.
    """
    link = cfg.link
    base = CostModel()
    ratios = dict(base.codec_ratio)
    ratios[Codec.INT4] = 1.0 / cfg.compression_ratio
    return CostModel(
        link_bytes_per_s={Tier.HBM: base.link_bytes_per_s[Tier.HBM],
                          Tier.HOST: link.bandwidth_gbps * 1e9,
                          Tier.NVME: link.nvme_bandwidth_gbps * 1e9},
        fixed_overhead_s={Tier.HBM: 0.0, Tier.HOST: link.fixed_overhead_ms / 1e3,
                          Tier.NVME: link.nvme_overhead_ms / 1e3},
        codec_ratio=ratios,
        codec_error=base.codec_error,
        codec_bytes_per_s=float("inf"),
        energy_per_byte=base.energy_per_byte,
    )


# The cost model's re-prefill rate when a workload carries no estimate of its own
# (hand-built batches): seconds per MB of KV at recompute weight 1.
PREFILL_S_PER_MB = 2.5e-3


class PageFactory:
    """Fills the caller-owned fields of a PageView from observables and type priors."""

    def make_view(self, *, page_id: int, size_bytes: int, state_type: StateType,
                  created: float, predicted_idle_s: float, session: str = "",
                  tool_class: str = "", confidence: float = 1.0,
                  recompute_est_s: float | None = None) -> PageView:
        """``predicted_idle_s``: the predicted first idle gap, from ``created`` (base.py)."""
        prior = TYPE_DEFAULTS[state_type]
        if recompute_est_s is None:
            recompute_est_s = size_bytes / MB * prior.recompute_weight * PREFILL_S_PER_MB
        return PageView(
            page_id=page_id, size_bytes=size_bytes, state_type=state_type,
            session=session, tool_class=tool_class or state_type.value,
            created=created, last_access=created,
            predicted_idle_s=predicted_idle_s, reuse_prob=prior.reuse_prob,
            confidence=confidence, recompute_cost_s=recompute_est_s,
            dependency=1.0,  # an unfinished consumer exists until the end-of-life signal
            correctness_weight=prior.correctness_weight,
        )


class FullPrecisionDriver:
    """LRU / TTL / semantic / ARC: victims go to host at full precision, no prefetch."""

    views_on_demand = True  # make_view reads nothing learned: a view may wait for its page

    def __init__(self, policy: EvictionPolicy, cfg: SimConfig) -> None:
        self.name = policy.name
        self.policy = policy
        self.cost = cost_model(cfg)
        self._views = PageFactory()

    def make_view(self, **fields: object) -> PageView:
        return self._views.make_view(**fields)  # type: ignore[arg-type]

    def demote(self, page: PageView, now: float) -> Demotion:
        return Demotion(tier=Tier.HOST, codec=Codec.FULL, stored_bytes=page.size_bytes)

    def prefetch_at(self, page: PageView, demotion: Demotion, now: float,
                    tool_started: float | None = None) -> float | None:
        return None

    def admit_prefetch(self, page: PageView, need_bytes: int, now: float) -> PrefetchAdmission:
        raise RuntimeError(f"{self.name} restores on demand only; it never schedules a prefetch")

    def observe_read(self, page: PageView, idle_s: float, tool_s: float, now: float) -> None:
        return None

    def observe_end(self, page: PageView, now: float) -> None:
        return None

    def retype(self, page: PageView, state_type: StateType, now: float) -> None:
        retype_view(page, state_type)

    def enter_gap(self, page: PageView, tool_class: str, now: float) -> None:
        if tool_class:
            page.tool_class = tool_class

    def produced(self, page: PageView, now: float) -> None:
        return None

    def finish(self, now: float) -> None:
        return None

    def restore_s(self, page: PageView, demotion: Demotion) -> float:
        return self.cost.restore_time(page.size_bytes, demotion.tier, demotion.codec)
