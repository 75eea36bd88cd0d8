"""State value, eq. (3): V = a*p*C_recomp + b*D + g*Q - d*C_move - e*C_occupy.

Coefficient profiles come from the task type and the SLO: code repair raises
the weight of correctness (Q) and recompute cost; open retrieval tolerates
aggressive compression (low quality-risk price lambda, low Q weight).
The same formula runs per page (``value``) and over numpy columns (``values``)
so the placement planner can score a million pages in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from agentkv_cluster.policy.base import CostModel, PageView, PolicyError, StateType
from store.types import Tier

GB = 1e9
TYPE_ORDER: tuple[StateType, ...] = tuple(StateType)  # index of PageColumns.type_idx
# keyed by the member's ``_value_`` (a plain attribute): str hashing is C-level, Enum's is not
_TYPE_VALUE_INDEX = {t._value_: i for i, t in enumerate(TYPE_ORDER)}


class UnknownProfile(PolicyError, KeyError):
    """No coefficient profile of that name."""


@dataclass(frozen=True, kw_only=True)
class ValueProfile:
    """Coefficients of eq. 3, plus lambda (price of quality risk, eq. 4)."""

    name: str
    alpha: float  # reuse-weighted recompute cost
    beta: float  # dependency strength
    gamma: float  # correctness impact Q
    delta: float  # move cost
    eta: float  # HBM occupancy (GB x predicted idle seconds)
    lam: float  # lambda of eq. 4: cost per unit of quality risk R_i


PROFILES: Mapping[str, ValueProfile] = {
    p.name: p
    for p in (
        ValueProfile(name="balanced", alpha=1.0, beta=0.10, gamma=0.30,
                     delta=1.0, eta=0.20, lam=0.02),
        ValueProfile(name="code-repair", alpha=1.6, beta=0.15, gamma=0.80,
                     delta=1.0, eta=0.15, lam=0.2),
        ValueProfile(name="open-retrieval", alpha=0.8, beta=0.10, gamma=0.10,
                     delta=1.0, eta=0.30, lam=0.005),
    )
}

REFERENCE_TTFT_S = 1.0  # SLO at which a profile's alpha applies unscaled


def profile_for(task_type: str, *, ttft_slo_s: float | None = None) -> ValueProfile:
    """The profile of ``task_type``; a tighter TTFT SLO raises the recompute weight."""
    try:
        profile = PROFILES[task_type]
    except KeyError:
        raise UnknownProfile(f"no value profile {task_type!r}; known: {sorted(PROFILES)}") from None
    if ttft_slo_s is None:
        return profile
    if ttft_slo_s <= 0:
        raise ValueError(f"ttft_slo_s must be > 0, got {ttft_slo_s}")
    scale = min(4.0, max(0.5, REFERENCE_TTFT_S / ttft_slo_s))
    return replace(profile, alpha=profile.alpha * scale, delta=profile.delta * scale)


@dataclass(slots=True)
class PageColumns:
    """Columnar copy of the PageView fields the value model and planner need."""

    page_ids: np.ndarray
    size: np.ndarray
    reuse: np.ndarray
    recompute_s: np.ndarray
    dependency: np.ndarray
    correctness: np.ndarray
    idle_s: np.ndarray
    pinned: np.ndarray
    type_idx: np.ndarray  # index into TYPE_ORDER
    structured: np.ndarray
    last_access: np.ndarray | None = None  # None: idle_s is read as seen at the last access
    confidence: np.ndarray | None = None

    @classmethod
    def from_pages(cls, pages: Sequence[PageView]) -> PageColumns:
        """One C-level pass per field (map + attrgetter): ~0.4 us per page and field."""
        n = len(pages)

        def col(attr: str, dtype: type) -> np.ndarray:
            return np.fromiter(map(attrgetter(attr), pages), dtype=dtype, count=n)

        types = map(_TYPE_VALUE_INDEX.__getitem__, map(attrgetter("state_type._value_"), pages))
        return cls(
            page_ids=col("page_id", np.int64),
            size=col("size_bytes", np.int64),
            reuse=col("reuse_prob", np.float64),
            recompute_s=col("recompute_cost_s", np.float64),
            dependency=col("dependency", np.float64),
            correctness=col("correctness_weight", np.float64),
            idle_s=col("predicted_idle_s", np.float64),
            pinned=col("pinned", np.bool_),
            type_idx=np.fromiter(types, dtype=np.int8, count=n),
            structured=col("produces_structured", np.bool_),
            last_access=col("last_access", np.float64),
            confidence=col("confidence", np.float64),
        )

    def invalid_rows(self, pages: Sequence[PageView]) -> np.ndarray:
        """Rows failing ``PageView.validate`` (the checks, vectorised)."""
        n = len(pages)

        def col(attr: str) -> np.ndarray:
            return np.fromiter(map(attrgetter(attr), pages), dtype=np.float64, count=n)

        bad = (self.size < 0) | (self.recompute_s < 0) | (self.dependency < 0) | (self.idle_s < 0)
        bad |= (col("importance") < 0) | (col("position") < 0) | (col("tokens") < 0)
        for p in (self.reuse, self.correctness, col("confidence"), col("branch_confidence")):
            bad |= ~((p >= 0.0) & (p <= 1.0))
        return np.flatnonzero(bad)


def _idle(page: PageView, now: float | None) -> float:
    """C_occupy's idle time (``ValueModel`` doc): |predicted return - ``now``|, or the
    whole predicted gap without ``now``."""
    if now is None:
        return page.predicted_idle_s
    return abs(page.last_access + page.predicted_idle_s - now)


class ValueModel:
    """Eq. 3 under one profile. ``use_dependency=False`` is the 'no event dependency' ablation.

    ``C_occupy`` is GB x the predicted idle time still ahead: with ``now`` given,
    the time to the predicted return, and once that return is overdue the time it
    is overdue (idle gaps are heavy-tailed: a page that has outlived its predicted
    gap is expected to wait about as long again, so the longer it is overdue the
    cheaper it is to evict; counting it as "about to be read" kept dead and
    stalled pages resident on real traces); without ``now``, the whole predicted
    gap (as seen at the last access).
    """

    def __init__(
        self,
        profile: ValueProfile = PROFILES["balanced"],
        cost: CostModel | None = None,
        *,
        use_dependency: bool = True,
    ) -> None:
        self.profile = profile
        self.cost = cost or CostModel()
        self.use_dependency = use_dependency
        link = self.cost.link_bytes_per_s[Tier.HOST]
        self._move_fixed = 2.0 * self.cost.fixed_overhead_s[Tier.HOST]
        self._move_per_byte = 2.0 / link
        p = profile
        # constants of the one-page path (eviction order): plain floats, no dict
        self._beta = p.beta if use_dependency else 0.0
        self._fixed = -p.delta * self._move_fixed
        self._per_byte = p.delta * self._move_per_byte
        self._eta_gb = p.eta / GB

    def terms(self, page: PageView, now: float | None = None) -> dict[str, float]:
        """The five terms of eq. 3 before weighting (for explanations and tests)."""
        return {
            "reuse_recompute": page.reuse_prob * page.recompute_cost_s,
            "dependency": page.dependency if self.use_dependency else 0.0,
            "correctness": page.correctness_weight,
            "move": self._move_fixed + self._move_per_byte * page.size_bytes,
            "occupy": page.size_bytes / GB * _idle(page, now),
        }

    def value(self, page: PageView, now: float | None = None) -> float:
        # the eviction order calls this per resident page per eviction: one flat expression
        p = self.profile
        size = page.size_bytes
        idle = page.predicted_idle_s
        if now is not None:
            idle = abs(idle + (page.last_access - now))
        return (
            p.alpha * page.reuse_prob * page.recompute_cost_s + self._beta * page.dependency
            + p.gamma * page.correctness_weight + self._fixed
            - size * (self._per_byte + self._eta_gb * idle)
        )

    def density(self, page: PageView, now: float | None = None) -> float:
        """V / m (value per GB): the phase-1 ranking key of the placement planner."""
        size = page.size_bytes
        return self.value(page, now) / max(1, size) * GB

    def values(self, cols: PageColumns, now: float | None = None) -> np.ndarray:
        p = self.profile
        dep = cols.dependency if self.use_dependency else 0.0
        idle = cols.idle_s
        if now is not None and cols.last_access is not None:
            idle = np.abs(cols.last_access + cols.idle_s - now)
        return (
            p.alpha * cols.reuse * cols.recompute_s + p.beta * dep + p.gamma * cols.correctness
            - p.delta * (self._move_fixed + self._move_per_byte * cols.size)
            - p.eta * cols.size / GB * idle
        )

    def densities(self, cols: PageColumns, now: float | None = None) -> np.ndarray:
        return self.values(cols, now) / np.maximum(cols.size, 1) * GB
