"""Tiered placement, eq. (4)-(5), by the paper's two-phase method.

Phase 1 fills HBM (full precision) by value density V/m, pinned pages first.
Phase 2 gives every other page the (tier, codec) option minimising the
Lagrangian cost ``p*L + E + lam*R + mu_HOST*m_HOST + mu_NVME*m_NVME``; the tier
prices mu are found by bisection on a fixed-size stride sample (so their cost
does not grow with n) and a repair pass then guarantees that no tier capacity
is exceeded (the recompute-only option holds no bytes and always fits). A page
whose risk decision keeps a reference copy pays for a FULL copy on NVMe when its
working copy is lossy. The full plan is O(n log n) (one sort, vectorised costs).

``replan`` reconsiders only the touched pages and what they displace, using a
min-heap of HBM residents and a max-heap of the rest (lazy deletion).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.policy.base import (
    DuplicatePage,
    InfeasiblePlan,
    PageId,
    PageView,
    Placement,
    PlacementDelta,
    PlacementPlan,
    PolicyError,
    UnknownPage,
)
from agentkv_cluster.policy.placement_costs import OPTIONS, OptionCosts
from agentkv_cluster.policy.risk import RiskController
from agentkv_cluster.policy.value import PageColumns, ValueModel
from store.types import Codec, Tier

_GONE = -2  # forgotten page
_UNPLACED = -1


class NotPlaced(PolicyError, LookupError):
    """The page was ``add``-ed but no ``replan`` has placed it yet."""


@dataclass(frozen=True, kw_only=True)
class PlacementConfig:
    allowed_codecs: tuple[Codec, ...] = tuple(Codec)  # ablations restrict this
    price_sample: int = 8192  # pages sampled to estimate the tier prices mu
    price_iters: int = 24


class PlacementPlanner:
    """Two-phase planner with incremental replanning. Not thread-safe."""

    def __init__(self, value_model: ValueModel, risk: RiskController | None = None,
                 config: PlacementConfig | None = None) -> None:
        self.value_model = value_model
        self.risk = risk or RiskController()
        self.config = config or PlacementConfig()
        self.costs = OptionCosts(value_model.cost, value_model.profile.lam,
                                 self.config.allowed_codecs)
        self._capacity: dict[Tier, int] = {t: 0 for t in Tier}
        self._reset()

    # ------------------------------------------------------------ full plan
    def plan(self, pages: Sequence[PageView], capacities: Mapping[Tier, int],
             now: float) -> PlacementPlan:
        """Place every page; raises InfeasiblePlan (nothing changed) if pinned pages overflow HBM."""
        capacity = _check_capacities(capacities)
        cols = PageColumns.from_pages(pages)
        for row in cols.invalid_rows(pages)[:1]:
            pages[row].validate()  # raises the specific InvalidPageView
        index = dict(zip(cols.page_ids.tolist(), range(len(pages))))
        if len(index) != len(pages):
            raise DuplicatePage("plan(): page ids are not unique")
        pinned_bytes = int(cols.size[cols.pinned].sum())
        if pinned_bytes > capacity[Tier.HBM]:
            raise InfeasiblePlan(
                f"pinned pages need {pinned_bytes} B of HBM, capacity {capacity[Tier.HBM]} B")
        density = self.value_model.densities(cols, now)
        order = np.lexsort((cols.page_ids, -density))  # density desc, id asc
        in_hbm = _fill_hbm(order, cols.size, cols.pinned, capacity[Tier.HBM] - pinned_bytes)
        rest = order[~in_hbm[order]]
        keep_ref, max_codec = self.risk.decide_columns(cols)
        rows = self.costs.rows(cols.size[rest], cols.reuse[rest], cols.recompute_s[rest],
                               cols.correctness[rest], keep_ref[rest], max_codec[rest])
        self._mu = rows.prices(capacity, self.config.price_sample, self.config.price_iters)
        choice = rows.feasible_choice(self._mu, capacity)
        tiers, codecs, stored, ref = _assemble(cols.size, in_hbm, rest, choice, rows)
        self._adopt(pages, cols, index, density, (tiers, codecs, stored, ref), capacity)
        return PlacementPlan(
            page_ids=_frozen(cols.page_ids), tiers=_frozen(tiers), codecs=_frozen(codecs),
            stored_bytes=_frozen(stored),
            reference_tiers=_frozen(np.where(ref > 0, int(Tier.NVME), -1).astype(np.int8)),
            used_bytes=dict(self._used), capacities=dict(capacity),
            objective=float(rows.cost_of(choice).sum()), planned_at=now,
        )

    # ------------------------------------------------------------ incremental
    def add(self, page: PageView) -> None:
        """Track a new page (unplaced until the next ``replan`` that touches it)."""
        page.validate()
        if page.page_id in self._index:
            raise DuplicatePage(f"page {page.page_id} is already tracked")
        self._index[page.page_id] = len(self._pages)
        self._pages.append(page)
        for lst, v in ((self._tier, _UNPLACED), (self._codec, 0), (self._stored, 0),
                       (self._ref, 0), (self._density, 0.0), (self._pinned_charged, False)):
            lst.append(v)

    def forget(self, page_id: PageId) -> None:
        """Stop tracking a page (retired); its bytes are released."""
        i = self._require(page_id)
        self._release(i)
        self._tier[i] = _GONE
        del self._index[page_id]

    def replan(self, touched_ids: Iterable[PageId], now: float) -> PlacementDelta:
        """Re-place the touched pages and whatever they displace.

        The caller mutates its PageViews and must list every page it changed
        (including a changed ``pinned`` flag); untouched pages keep their place.
        """
        idx = [self._require(pid) for pid in dict.fromkeys(touched_ids)]
        for i in idx:
            self._pages[i].validate()
        self._check_pinned(idx)
        before = {i: self._placement_key(i) for i in idx}
        for i in idx:
            self._release(i)
            self._density[i] = self.value_model.density(self._pages[i], now)
        idx.sort(key=lambda i: (not self._pages[i].pinned, -self._density[i]))
        lower: list[int] = []
        for i in idx:
            if not self._pages[i].pinned:  # denser lower-tier pages get freed space first
                self._pull_into_hbm(before, above=self._density[i])
            if not self._place_hbm(i, lower, before):
                lower.append(i)
        self._pull_into_hbm(before)
        for i in lower:
            self._place_lower(i)
        changes = tuple(self.placement(self._pages[i].page_id) for i in before
                        if self._placement_key(i) != before[i])
        return PlacementDelta(changes=changes, used_bytes=dict(self._used),
                              considered=len(before), planned_at=now)

    def placement(self, page_id: PageId) -> Placement:
        i = self._require(page_id)
        if self._tier[i] == _UNPLACED:
            raise NotPlaced(f"page {page_id} has not been placed by a replan yet")
        ref = self._ref[i]
        return Placement(page_id=page_id, tier=Tier(self._tier[i]), codec=Codec(self._codec[i]),
                         stored_bytes=self._stored[i],
                         reference_tier=Tier.NVME if ref else None, reference_bytes=ref)

    def used_bytes(self) -> dict[Tier, int]:
        return dict(self._used)

    # ------------------------------------------------------------ internals
    def _reset(self) -> None:
        self._pages: list[PageView] = []
        self._index: dict[PageId, int] = {}
        self._tier: list[int] = []
        self._codec: list[int] = []
        self._stored: list[int] = []
        self._ref: list[int] = []
        self._density: list[float] = []
        self._pinned_charged: list[bool] = []  # HBM bytes counted as pinned
        self._pinned_bytes = 0
        self._used: dict[Tier, int] = {t: 0 for t in Tier}
        # ties evict the page the full plan admitted last (higher index) first
        self._hbm_heap: list[tuple[float, int]] = []  # (density, -index), min first
        self._low_heap: list[tuple[float, int]] = []  # (-density, index), max first
        self._mu = (0.0, 0.0)

    def _adopt(self, pages, cols, index, density, placed, capacity) -> None:
        tiers, codecs, stored, ref = placed
        self._reset()
        self._capacity = capacity
        self._pages = list(pages)
        self._index = index
        self._tier, self._codec = tiers.tolist(), codecs.tolist()
        self._stored, self._ref = stored.tolist(), ref.tolist()
        self._density = density.tolist()
        self._pinned_charged = cols.pinned.tolist()
        self._pinned_bytes = int(cols.size[cols.pinned].sum())
        for t in Tier:
            self._used[t] = int(stored[tiers == int(t)].sum())
        self._used[Tier.NVME] += int(ref.sum())
        hbm = (tiers == int(Tier.HBM)) & ~cols.pinned
        hi = np.flatnonzero(hbm)
        self._hbm_heap = list(zip(density[hi].tolist(), (-hi).tolist()))
        heapq.heapify(self._hbm_heap)
        lo = np.flatnonzero(tiers != int(Tier.HBM))
        self._low_heap = list(zip((-density[lo]).tolist(), lo.tolist()))
        heapq.heapify(self._low_heap)

    def _require(self, page_id: PageId) -> int:
        try:
            return self._index[page_id]
        except KeyError:
            raise UnknownPage(f"page {page_id} is not tracked by the planner") from None

    def _placement_key(self, i: int) -> tuple[int, int, int, int]:
        return (self._tier[i], self._codec[i], self._stored[i], self._ref[i])

    def _check_pinned(self, idx: list[int]) -> None:
        pinned = self._pinned_bytes
        pinned -= sum(self._stored[i] for i in idx if self._pinned_charged[i])
        pinned += sum(self._pages[i].size_bytes for i in idx if self._pages[i].pinned)
        if pinned > self._capacity[Tier.HBM]:
            raise InfeasiblePlan(
                f"pinned pages need {pinned} B of HBM, capacity {self._capacity[Tier.HBM]} B")

    def _release(self, i: int) -> None:
        tier = self._tier[i]
        if tier >= 0:
            self._used[Tier(tier)] -= self._stored[i]
            self._used[Tier.NVME] -= self._ref[i]
        if self._pinned_charged[i]:
            self._pinned_bytes -= self._stored[i]
            self._pinned_charged[i] = False
        self._tier[i], self._codec[i], self._stored[i], self._ref[i] = _UNPLACED, 0, 0, 0

    def _set(self, i: int, tier: Tier, codec: Codec, stored: int, ref: int) -> None:
        self._tier[i], self._codec[i], self._stored[i], self._ref[i] = int(tier), int(codec), stored, ref
        self._used[tier] += stored
        self._used[Tier.NVME] += ref
        if tier is Tier.HBM:
            if self._pages[i].pinned:
                self._pinned_charged[i] = True
                self._pinned_bytes += stored
            else:
                heapq.heappush(self._hbm_heap, (self._density[i], -i))
        else:
            heapq.heappush(self._low_heap, (-self._density[i], i))

    def _valid_top(self, heap: list[tuple[float, int]], hbm: bool) -> tuple[float, int] | None:
        """(density, index) of the heap's first live entry; stale entries are dropped."""
        while heap:
            key, code = heap[0]
            density, i = (key, -code) if hbm else (-key, code)
            in_hbm = self._tier[i] == int(Tier.HBM)
            movable = not (hbm and self._pages[i].pinned)
            if density == self._density[i] and in_hbm == hbm and self._tier[i] >= 0 and movable:
                return density, i
            heapq.heappop(heap)
        return None

    def _place_hbm(self, i: int, lower: list[int], before: dict) -> bool:
        """Put page i in HBM if it fits or lower-density pages can make room."""
        page, size = self._pages[i], self._pages[i].size_bytes
        free = self._capacity[Tier.HBM] - self._used[Tier.HBM]
        victims: list[tuple[float, int]] = []
        while free < size:
            top = self._valid_top(self._hbm_heap, hbm=True)
            if top is None or (not page.pinned and top[0] >= self._density[i]):
                break
            victims.append(heapq.heappop(self._hbm_heap))
            free += self._stored[top[1]]
        if free < size:
            for entry in victims:
                heapq.heappush(self._hbm_heap, entry)
            return False
        for _, code in victims:
            v = -code
            before.setdefault(v, self._placement_key(v))
            self._release(v)
            lower.append(v)
        self._set(i, Tier.HBM, Codec.FULL, size, 0)
        return True

    def _pull_into_hbm(self, before: dict, above: float = -np.inf) -> None:
        """Fill free HBM with the densest lower-tier pages (denser than ``above``) that fit."""
        while True:
            top = self._valid_top(self._low_heap, hbm=False)
            if top is None or top[0] <= above:
                return
            i = top[1]
            size = self._pages[i].size_bytes
            if size > self._capacity[Tier.HBM] - self._used[Tier.HBM]:
                return
            heapq.heappop(self._low_heap)
            before.setdefault(i, self._placement_key(i))
            self._release(i)
            self._set(i, Tier.HBM, Codec.FULL, size, 0)

    def _place_lower(self, i: int) -> None:
        page = self._pages[i]
        decision = self.risk.decide(page)
        free = {t: self._capacity[t] - self._used[t] for t in (Tier.HOST, Tier.NVME)}
        k, stored, ref = self.costs.best_single(
            size=page.size_bytes, reuse=page.reuse_prob, recompute_s=page.recompute_cost_s,
            correctness=page.correctness_weight, keep_ref=decision.keep_reference,
            max_codec=decision.max_lossy_codec, mu=self._mu, free=free)
        tier, codec = OPTIONS[k]
        self._set(i, tier, codec, stored, ref)


def _check_capacities(capacities: Mapping[Tier, int]) -> dict[Tier, int]:
    out = {t: 0 for t in Tier}
    for tier, cap in capacities.items():
        if not isinstance(tier, Tier):
            raise TypeError(f"capacity key {tier!r} is not a Tier")
        if int(cap) < 0:
            raise ValueError(f"capacity of {tier.name} must be >= 0, got {cap}")
        out[tier] = int(cap)
    return out


def _fill_hbm(order: np.ndarray, size: np.ndarray, pinned: np.ndarray, free: int) -> np.ndarray:
    """Greedy by density: take the densest pages that fit; a few passes pack smaller ones."""
    in_hbm = pinned.copy()
    cand = order[~pinned[order]]
    for _ in range(4):
        fits = cand[size[cand] <= free]
        take = fits[np.cumsum(size[fits]) <= free]
        if take.size == 0:
            break
        in_hbm[take] = True
        free -= int(size[take].sum())
        cand = cand[~in_hbm[cand]]
    return in_hbm


def _assemble(size, in_hbm, rest, choice, rows):
    n = len(size)
    tiers = np.full(n, int(Tier.HBM), dtype=np.int8)
    codecs = np.full(n, int(Codec.FULL), dtype=np.int8)
    stored = np.where(in_hbm, size, 0).astype(np.int64)
    ref = np.zeros(n, dtype=np.int64)
    r = np.arange(len(rest))
    tiers[rest] = rows.option_tiers[choice]
    codecs[rest] = rows.option_codecs[choice]
    stored[rest] = rows.stored[r, choice]
    ref[rest] = rows.ref[r, choice]
    return tiers, codecs, stored, ref


def _frozen(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a
