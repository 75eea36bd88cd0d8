"""What every policy sees and returns: the page record, the eviction interface, plan types.

The simulator and the Ray service code against this module; the classes that
produce these records live next to it:

- ``predictor.Predictor(config=None)``: ``predict(page, now, queue_pressure=0.0) -> Prediction``,
  ``observe_reuse(page, reused, now)``, ``observe_tool(tool_class, duration_s)``,
  ``confidence(tool_class)``; ``.tools.distribution(tool_class) -> LogNormal``;
  ``.calibration.brier()`` / ``.reliability(bins)``.
- ``value.ValueModel(profile, cost=None, *, use_dependency=True)``: ``value(page)``,
  ``density(page)`` (V/m per GB); ``PROFILES[name]``, ``profile_for(task, ttft_slo_s=)``.
- ``placement.PlacementPlanner(value_model, risk=None, config=None)``:
  ``plan(pages, capacities, now) -> PlacementPlan``; ``replan(touched_ids, now) ->
  PlacementDelta``; ``add(page)``, ``forget(page_id)``, ``placement(page_id) -> Placement``.
- ``gap.GapPlanner(cost, predictor, value_model, risk=None, config=None)``:
  ``plan(tool_start, pages, now) -> GapPlan``; ``early_return(plan, pages, now) ->
  EarlyReturnReport``.
- ``risk.RiskController(config=None)``: ``decide(page) -> RiskDecision``,
  ``needs_checkpoint``, ``needs_recompute``, ``guard_demotion``,
  ``risk_proxy(page, *, tier, codec, predicted_idle_s, actual_idle_s) -> float``.
- ``credits.CreditManager(config)``: ``acquire(request, now) -> CreditGrant``,
  ``poll(now) -> list[CreditGrant]``, ``release(grant, now)``, ``cancel(ticket)``.
- ``baselines``: ``LruPolicy()``, ``TtlPolicy()``, ``SemanticPolicy()``,
  ``ArcPolicy(capacity_bytes)``; ``agentkv.AgentKvPolicy(config=None, predictor=None)``
  with ``demotion(page, free=None) -> Placement``, ``on_tool_start(...) -> GapPlan``,
  ``on_tool_return(plan, pages, now) -> EarlyReturnReport``,
  ``admit_prefetch(page, need_bytes, now) -> PrefetchAdmission``. All implement
  ``EvictionPolicy``, including ``on_consumers_done(page, now, *, retirable=True,
  signal=EndOfLife.TASK_END) -> RetireDecision``. AgentKV acts on every end-of-life
  signal; a baseline acts on the ones it was built with (``signals=``; default none,
  the paper's baselines) and then frees the page from every tier, as vLLM frees the
  blocks of a finished request.

Time is always passed in as ``now`` (seconds, any epoch); nothing here reads a clock.

``PageView.predicted_idle_s`` has one meaning everywhere: the predicted length of
the page's current idle gap, measured from ``last_access`` (the predicted next
access is at ``last_access + predicted_idle_s``). It does not change as time
passes; a policy that needs the time still to wait computes
``remaining_idle_s(page, now)``. A caller holding a residual-life prediction made
at ``now`` (``Predictor.predict``'s ``idle_quantiles``) stores
``Predictor.gap_estimate(page, now)``, i.e. elapsed + remaining.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agentkv_cluster.lifecycle.types import PageId, StateType
from store.types import Codec, Tier


class EndOfLife(enum.Enum):
    """The end-of-life signals a real orchestrator emits for a page."""

    TASK_END = "task_end"  # the task (session) holding the page finished
    BRANCH_ABANDONED = "branch_abandoned"  # the branch that produced it failed / was dropped
    VERSION_SUPERSEDED = "version_superseded"  # a newer version replaced it


ALL_SIGNALS: frozenset[EndOfLife] = frozenset(EndOfLife)


class PolicyError(Exception):
    """Base of every error raised by the policy layer."""


class InvalidPageView(PolicyError, ValueError):
    """A PageView field is out of range (negative size, probability outside [0, 1], ...)."""


class UnknownPage(PolicyError, KeyError):
    """A page id that the policy or planner does not track."""


class DuplicatePage(PolicyError, ValueError):
    """``on_insert`` of a page id that is already tracked."""


class InfeasiblePlan(PolicyError):
    """Pinned pages alone exceed a tier's capacity; nothing was changed."""


@dataclass(slots=True, kw_only=True)
class PageView:
    """The policy's view of one KV state page (hot, mutable, slotted).

    The caller owns the record: it fills the predictions (``reuse_prob``,
    ``predicted_idle_s``) and the type defaults (``correctness_weight``), mutates
    it on events and tells the policy/planner which ids it touched.
    """

    page_id: PageId
    size_bytes: int  # full-precision bytes (m_i at Codec.FULL)
    state_type: StateType
    session: str = ""
    tenant: str = ""
    tier: Tier = Tier.HBM
    codec: Codec = Codec.FULL
    position: int = 0  # first token of the page within its session (prefix order)
    tokens: int = 0  # tokens the page covers: [position, position + tokens)
    created: float = 0.0
    last_access: float = 0.0
    access_count: int = 0
    predicted_idle_s: float = 0.0  # predicted whole idle gap from last_access (module doc)
    reuse_prob: float = 0.5  # p_reuse, eq. 2
    confidence: float = 1.0  # predictor confidence in [0, 1]
    recompute_cost_s: float = 0.0  # C_recomp: seconds to re-prefill / re-run
    recompute_tokens: int = 0
    dependency: float = 0.0  # D_i: unfinished reachable consumers, critical-path weight
    correctness_weight: float = 0.0  # Q_i in [0, 1]
    importance: float = 0.0  # approximate attention importance (semantic baseline)
    tool_class: str = ""  # tool whose call this page waits on, if any
    task_depth: int = 0
    successors: int = 0  # number of successor nodes in the event graph
    branch_confidence: float = 1.0
    prefix_share: int = 1  # how many sessions share this (prefix) page
    produces_structured: bool = False  # feeds code / JSON output (risk controller)
    pinned: bool = False  # in use by the engine: never a victim, always in HBM

    def validate(self) -> None:
        """Raise InvalidPageView when a field is out of range."""
        if self.size_bytes < 0:
            raise InvalidPageView(f"page {self.page_id}: size_bytes {self.size_bytes} < 0")
        for name in ("reuse_prob", "confidence", "correctness_weight", "branch_confidence"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidPageView(f"page {self.page_id}: {name}={value} outside [0, 1]")
        for name in ("predicted_idle_s", "recompute_cost_s", "dependency", "importance",
                     "position", "tokens"):
            if getattr(self, name) < 0:
                raise InvalidPageView(f"page {self.page_id}: {name} < 0")


@runtime_checkable
class EvictionPolicy(Protocol):
    """One interface for LRU, TTL, semantic, ARC and AgentKV.

    The policy tracks the pages resident in the fast tier. ``select_victims``
    evicts exactly enough (the shortest prefix of its victim order whose bytes
    reach ``need_bytes``) and stops tracking them, or returns ``[]`` and changes
    nothing when the unpinned pages cannot cover ``need_bytes``.
    ``on_remove`` forgets a page entirely (retired, deleted) without counting it
    as an eviction.
    """

    name: str

    def on_insert(self, page: PageView, now: float) -> None: ...

    def on_access(self, page: PageView, now: float) -> None: ...

    def on_update(self, page: PageView, now: float) -> None: ...

    def on_remove(self, page_id: PageId) -> None: ...

    def select_victims(self, need_bytes: int, now: float) -> list[PageId]: ...

    def resident_bytes(self) -> int: ...

    def on_consumers_done(self, page: PageView, now: float, *, retirable: bool = True,
                          signal: EndOfLife = EndOfLife.TASK_END) -> RetireDecision: ...


def remaining_idle_s(page: PageView, now: float) -> float:
    """Predicted time from ``now`` until the page's next access, floored at 0
    (a page past its predicted return is about to be used)."""
    return max(0.0, page.last_access + page.predicted_idle_s - now)


@dataclass(frozen=True, kw_only=True)
class RetireDecision:
    """The answer to the event graph's "every reachable consumer is done" signal."""

    page_id: PageId
    retire: bool  # drop every copy (HBM and lower tiers); the policy no longer tracks it
    reason: str


@dataclass(frozen=True, kw_only=True)
class PrefetchAdmission:
    """Whether a prefetched page may enter the fast tier, and whom it displaces."""

    page_id: PageId
    admitted: bool  # True: the page is tracked now and ``victims`` are no longer
    victims: tuple[PageId, ...]  # pages to demote to make room (empty when not admitted)


# ---------------------------------------------------------------- costs


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Bytes, bandwidth and error per tier and codec (shared by planners and simulator)."""

    link_bytes_per_s: Mapping[Tier, float] = field(
        default_factory=lambda: {Tier.HBM: 900e9, Tier.HOST: 24e9, Tier.NVME: 6e9}
    )
    fixed_overhead_s: Mapping[Tier, float] = field(
        default_factory=lambda: {Tier.HBM: 0.0, Tier.HOST: 1.2e-3, Tier.NVME: 2.5e-3}
    )
    # stored bytes / full bytes; INT4 incl. scales = the paper's 3.2:1
    codec_ratio: Mapping[Codec, float] = field(
        default_factory=lambda: {
            Codec.FULL: 1.0, Codec.INT8: 0.53, Codec.INT4: 1 / 3.2,
            Codec.LOW_RANK: 0.25, Codec.RECOMPUTE: 0.0,
        }
    )
    # expected relative error of a restore from this codec (quality risk R_i)
    codec_error: Mapping[Codec, float] = field(
        default_factory=lambda: {
            Codec.FULL: 0.0, Codec.INT8: 0.01, Codec.INT4: 0.05,
            Codec.LOW_RANK: 0.12, Codec.RECOMPUTE: 0.0,
        }
    )
    codec_bytes_per_s: float = 200e9  # compress + decompress throughput over full bytes
    # seconds a restore from a lossy form costs beyond its bytes and codec throughput (a
    # path of its own, e.g. a decode step between two hops); 0 where decoding is in line
    codec_fixed_s: float = 0.0
    energy_per_byte: float = 1e-11  # E_i weight per byte over a link (seconds-equivalent)
    # E_i weight per full byte through a codec pass: an on-GPU pass, far cheaper per
    # byte than a link transfer (pricing it like one made compression look dearer
    # than the restore time it saves)
    codec_energy_per_byte: float = 1e-12

    def stored_bytes(self, size_bytes: int, codec: Codec) -> int:
        return round(size_bytes * self.codec_ratio[codec])

    def move_time(self, size_bytes: int, tier: Tier, codec: Codec) -> float:
        """T_move of eq. 6: evict + compress + restore + decompress for one page."""
        if codec is Codec.RECOMPUTE:
            return 0.0
        stored = size_bytes * self.codec_ratio[codec]
        link = self.link_bytes_per_s[tier]
        return (2.0 * (self.fixed_overhead_s[tier] + stored / link)
                + self.codec_time(size_bytes, codec, passes=2))

    def restore_time(self, size_bytes: int, tier: Tier, codec: Codec) -> float:
        """L_i(k, q): one restore (read + decompress) from ``tier`` in ``codec``."""
        if tier is Tier.HBM:
            return 0.0
        stored = size_bytes * self.codec_ratio[codec]
        return (self.fixed_overhead_s[tier] + stored / self.link_bytes_per_s[tier]
                + self.codec_time(size_bytes, codec))

    def codec_time(self, size_bytes: int, codec: Codec, passes: int = 1) -> float:
        """Seconds of ``passes`` codec passes over a page (decode; a move also encodes)
        plus a lossy form's own fixed path; nothing for FULL."""
        if codec is Codec.FULL:
            return 0.0
        return passes * size_bytes / self.codec_bytes_per_s + self.codec_fixed_s


# ---------------------------------------------------------------- predictions


@dataclass(frozen=True, kw_only=True)
class Prediction:
    p_reuse: float
    idle_quantiles: Mapping[float, float]  # quantile -> seconds until next access
    confidence: float
    confident: bool  # confidence >= threshold; else callers use the conservative policy


# ---------------------------------------------------------------- placement


@dataclass(frozen=True, kw_only=True)
class Placement:
    page_id: PageId
    tier: Tier  # Codec.RECOMPUTE pages hold no bytes; their tier is reported as NVME
    codec: Codec
    stored_bytes: int  # bytes charged to ``tier``
    reference_tier: Tier | None = None  # where a FULL reference copy is kept, if any
    reference_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class PlacementPlan:
    """A full plan. Columnar (numpy arrays, read-only) so 1M pages stay cheap."""

    page_ids: object  # np.ndarray[int64]
    tiers: object  # np.ndarray[int8] of Tier values
    codecs: object  # np.ndarray[int8] of Codec values
    stored_bytes: object  # np.ndarray[int64]
    reference_tiers: object  # np.ndarray[int8], -1 = no reference copy
    used_bytes: Mapping[Tier, int]
    capacities: Mapping[Tier, int]
    objective: float  # sum of eq. 4 costs over non-HBM pages
    planned_at: float = 0.0

    def __len__(self) -> int:
        return len(self.page_ids)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PlacementDelta:
    """What an incremental replan changed: only pages whose placement moved."""

    changes: tuple[Placement, ...]
    used_bytes: Mapping[Tier, int]
    considered: int  # pages re-evaluated (touched + displaced)
    planned_at: float = 0.0


# ---------------------------------------------------------------- tool gaps


@dataclass(frozen=True, kw_only=True)
class ToolStart:
    session: str
    call_id: str
    tool_class: str
    started_at: float


@dataclass(frozen=True, kw_only=True)
class Migration:
    page_id: PageId
    start_at: float
    to_tier: Tier
    codec: Codec
    moved_bytes: int
    t_move_s: float
    hideable: float  # H_i of eq. 6
    expected_return: float = 0.0  # predicted tool return as seen from this wave's start


@dataclass(frozen=True, kw_only=True)
class Prefetch:
    page_id: PageId
    start_at: float  # predicted return - T_move
    from_tier: Tier
    codec: Codec
    moved_bytes: int
    link_credit_bytes: int  # reserved on the link for this prefetch


@dataclass(frozen=True, kw_only=True)
class GapPlan:
    tool_start: ToolStart
    predicted_return: float
    migrations: tuple[Migration, ...]  # ordered by start_at (progressive demotion)
    prefetches: tuple[Prefetch, ...]  # ordered by start_at
    cancel_on_early_return: bool = True


@dataclass(frozen=True, kw_only=True)
class EarlyReturnReport:
    returned_at: float
    cancelled_prefetches: tuple[PageId, ...]
    cancelled_migrations: tuple[PageId, ...]  # not yet started when the tool returned
    resident_prefix: tuple[PageId, ...]  # largest prefix (by position) still in HBM
    resident_prefix_tokens: int  # position where the resident prefix ends


# ---------------------------------------------------------------- risk


@dataclass(frozen=True, kw_only=True)
class RiskDecision:
    page_id: PageId
    keep_reference: bool  # keep a FULL reference copy in a lower tier
    checkpoint: bool  # verify against the reference after a lossy restore
    recompute_entry: bool  # keep token ids + identity to re-prefill
    max_lossy_codec: Codec  # most aggressive codec allowed for the working copy


# ---------------------------------------------------------------- AgentKV switches


@dataclass(frozen=True, kw_only=True)
class Mechanisms:
    """Which AgentKV mechanisms are on (Table 5 ablations turn one off)."""

    gap_prefetch: bool = True
    reversible_compression: bool = True
    event_dependency: bool = True
    risk_control: bool = True
    adaptive_precision: bool = True  # off = one fixed lossy codec (INT8)

