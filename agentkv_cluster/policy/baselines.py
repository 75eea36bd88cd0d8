"""Baseline eviction policies behind the one ``EvictionPolicy`` interface.

Each is a small override of ``_victim_order``; bookkeeping (tracking, the
"evict exactly enough or change nothing" rule, pinned pages, end-of-life
signals) is shared (``tracked.TrackedPolicy``, re-exported here). ``signals=``
names the end-of-life signals a baseline acts on: none by default (the paper's
baselines), or any of ``EndOfLife`` (the fair baselines: a finished task, an
abandoned branch, a superseded version frees the page from every tier, as vLLM
frees a finished request's blocks). From 256 resident pages TTL and semantic
read their order from a structure kept between calls (``order``), the same
order as their sort.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from agentkv_cluster.policy.base import EndOfLife, PageId, PageView, StateType, remaining_idle_s
from agentkv_cluster.policy.columns import COLUMNAR_MIN_PAGES, RowStore, lexsorted_ids
from agentkv_cluster.policy.order import KeyedHeap, NowOrder
from agentkv_cluster.policy.tracked import TrackedPolicy, take_exactly

__all__ = [
    "SEMANTIC_TYPE_PRIORITY",
    "ArcPolicy",
    "LruPolicy",
    "SemanticPolicy",
    "TrackedPolicy",
    "TtlPolicy",
    "take_exactly",
]

# Semantic priority of each state type (higher = keep longer). Mirrors the
# default policies of paper Table 1: prefixes and verified results are kept,
# failed branches retire first.
SEMANTIC_TYPE_PRIORITY: Mapping[StateType, float] = {
    StateType.FIXED_PREFIX: 1.0,
    StateType.VERIFIED_RESULT: 0.9,
    StateType.TASK_INPUT: 0.8,
    StateType.EVIDENCE: 0.6,
    StateType.TOOL_OBSERVATION: 0.5,
    StateType.TEMP_REASONING: 0.3,
    StateType.FAILED_BRANCH: 0.0,
}


class LruPolicy(TrackedPolicy):
    """Least recently used first."""

    name = "lru"

    def __init__(self, *, signals: Iterable[EndOfLife] = ()) -> None:
        super().__init__(signals=signals)
        self._order: OrderedDict[PageId, None] = OrderedDict()

    def _inserted(self, page: PageView, now: float) -> None:
        self._order[page.page_id] = None

    def _accessed(self, page: PageView, now: float) -> None:
        self._order.move_to_end(page.page_id)

    def _removed(self, page_id: PageId) -> None:
        del self._order[page_id]

    def _victim_order(self, now: float) -> Iterator[PageId]:
        return iter(self._order)


class _ColumnarSorted(TrackedPolicy):
    """A sort-based baseline whose key columns are also kept as numpy rows, so large
    resident sets are ranked in one vectorised pass (``columns``)."""

    _FIELDS: tuple[str, ...] = ()

    def __init__(self, *, signals: Iterable[EndOfLife] = ()) -> None:
        super().__init__(signals=signals)
        self._rows = RowStore(self._FIELDS)

    def _row(self, page: PageView) -> tuple[float, ...]:
        raise NotImplementedError

    def _inserted(self, page: PageView, now: float) -> None:
        self._put(page)

    def _refreshed(self, page: PageView) -> None:
        self._put(page)

    def _removed(self, page_id: PageId) -> None:
        self._rows.drop(page_id)
        self._touched(page_id)

    def _put(self, page: PageView) -> None:
        self._rows.put(page.page_id, self._row(page))
        self._touched(page.page_id)

    def _touched(self, page_id: PageId) -> None:
        """The row of ``page_id`` was put or dropped."""


class TtlPolicy(_ColumnarSorted):
    """Evict the page whose predicted remaining idle time x size is largest.

    Remaining idle is ``remaining_idle_s(page, now)``. Ties: older access first.
    """

    name = "ttl"
    _FIELDS = ("deadline", "size", "last_access")

    def __init__(self, *, signals: Iterable[EndOfLife] = ()) -> None:
        super().__init__(signals=signals)
        # kept from the second call at one ``now``: a lone call's columnar sort is as cheap
        self._kept = NowOrder(self._rows, self._key_columns, second_ask=True)

    def _row(self, page: PageView) -> tuple[float, ...]:
        return (page.last_access + page.predicted_idle_s, float(page.size_bytes),
                page.last_access)

    def _key_columns(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, ...]:
        c = self._rows.cols
        remaining = np.maximum(c["deadline"][rows] - now, 0.0)
        return (-remaining * c["size"][rows], c["last_access"][rows])

    def _touched(self, page_id: PageId) -> None:
        self._kept.touch(page_id)

    def _order_done(self) -> None:
        self._kept.restore()

    def _victim_walk(self, now: float) -> Iterable[PageId]:
        if len(self._pages) >= COLUMNAR_MIN_PAGES:  # kept between calls at one ``now``
            kept = self._kept.ordered(now, None)
            if kept is not None:
                return kept
        return self._victim_order(now)

    def _victim_order(self, now: float) -> Iterable[PageId]:
        if len(self._pages) >= COLUMNAR_MIN_PAGES:
            r = self._rows
            rows = r.rows()
            ids = r.ids[rows]
            primary, last_access = self._key_columns(rows, now)
            return lexsorted_ids(ids, (ids, last_access, primary))

        def key(page: PageView) -> tuple[float, float, PageId]:
            remaining = remaining_idle_s(page, now)
            return (-remaining * page.size_bytes, page.last_access, page.page_id)

        return [p.page_id for p in sorted(self._pages.values(), key=key)]


class SemanticPolicy(_ColumnarSorted):
    """Evict the lowest semantic priority: type + importance + correctness weight."""

    name = "semantic"
    _FIELDS = ("priority", "last_access")

    def __init__(self, type_priority: Mapping[StateType, float] = SEMANTIC_TYPE_PRIORITY, *,
                 signals: Iterable[EndOfLife] = ()) -> None:
        self._type_priority = dict(type_priority)
        super().__init__(signals=signals)
        self._kept = KeyedHeap()

    def _put(self, page: PageView) -> None:
        row = self._row(page)
        self._rows.put(page.page_id, row)
        self._kept.put((float(row[0]), float(row[1]), page.page_id))  # the rows' floats

    def _removed(self, page_id: PageId) -> None:
        super()._removed(page_id)
        self._kept.discard(page_id)

    def _order_done(self) -> None:
        self._kept.restore()

    def _row(self, page: PageView) -> tuple[float, ...]:
        return (self.priority(page), page.last_access)

    def priority(self, page: PageView) -> float:
        return (
            self._type_priority[page.state_type]
            + page.importance
            + page.correctness_weight
        )

    def _victim_walk(self, now: float) -> Iterable[PageId]:
        if len(self._pages) >= COLUMNAR_MIN_PAGES and not self._kept.has_nan:
            return self._kept.ordered()  # (priority, last_access, id): a kept heap
        return self._victim_order(now)

    def _victim_order(self, now: float) -> Iterable[PageId]:
        if len(self._pages) >= COLUMNAR_MIN_PAGES:
            r = self._rows
            rows = r.rows()
            ids = r.ids[rows]
            return lexsorted_ids(ids, (ids, r.cols["last_access"][rows],
                                       r.cols["priority"][rows]))

        def key(page: PageView) -> tuple[float, float, PageId]:
            return (self.priority(page), page.last_access, page.page_id)

        return [p.page_id for p in sorted(self._pages.values(), key=key)]


class _SizedList:
    """An LRU-ordered id -> size map that keeps its byte total (O(1) updates)."""

    __slots__ = ("bytes", "items")

    def __init__(self) -> None:
        self.items: OrderedDict[PageId, int] = OrderedDict()
        self.bytes = 0

    def push(self, page_id: PageId, size: int) -> None:
        self.items[page_id] = size
        self.bytes += size

    def pop(self, page_id: PageId) -> int:
        size = self.items.pop(page_id)
        self.bytes -= size
        return size

    def discard(self, page_id: PageId) -> None:
        if page_id in self.items:
            self.pop(page_id)

    def pop_oldest(self) -> None:
        _, size = self.items.popitem(last=False)
        self.bytes -= size


_END = object()  # end of a lazily read list


class ArcPolicy(TrackedPolicy):
    """Adaptive Replacement Cache (Megiddo & Modha), counted in bytes.

    T1 holds pages seen once, T2 pages seen at least twice; B1/B2 are ghost
    lists of recently evicted ids. A ghost hit on insert adapts the target size
    ``p`` of T1. ``capacity_bytes`` is the fast-tier size the ghosts are sized to.
    """

    name = "arc"

    def __init__(self, capacity_bytes: int, *, signals: Iterable[EndOfLife] = ()) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        super().__init__(signals=signals)
        self.capacity = capacity_bytes
        self.p = 0.0  # target bytes of T1
        self._t1, self._t2 = _SizedList(), _SizedList()
        self._b1, self._b2 = _SizedList(), _SizedList()

    @property
    def lists(self) -> dict[str, list[PageId]]:
        """LRU-to-MRU contents of T1, T2, B1, B2 (for tests and metrics)."""
        named = (("t1", self._t1), ("t2", self._t2), ("b1", self._b1), ("b2", self._b2))
        return {n: list(lst.items) for n, lst in named}

    def _inserted(self, page: PageView, now: float) -> None:
        pid, size = page.page_id, page.size_bytes
        b1, b2 = self._b1.bytes, self._b2.bytes
        if pid in self._b1.items:
            self.p = min(float(self.capacity), self.p + max(b2 / max(b1, 1), 1.0) * size)
            self._b1.pop(pid)
            self._t2.push(pid, size)
        elif pid in self._b2.items:
            self.p = max(0.0, self.p - max(b1 / max(b2, 1), 1.0) * size)
            self._b2.pop(pid)
            self._t2.push(pid, size)
        else:
            self._t1.push(pid, size)
        self._trim_ghosts()

    def _accessed(self, page: PageView, now: float) -> None:
        self._removed(page.page_id)
        self._t2.push(page.page_id, page.size_bytes)

    def _removed(self, page_id: PageId) -> None:
        self._t1.discard(page_id)
        self._t2.discard(page_id)

    def _evicted(self, page_id: PageId) -> None:
        if page_id in self._t1.items:
            self._b1.push(page_id, self._t1.pop(page_id))
        else:
            self._b2.push(page_id, self._t2.pop(page_id))
        self._trim_ghosts()

    def _victim_order(self, now: float) -> Iterator[PageId]:
        """REPLACE repeated: take from T1 while it exceeds p, else from T2. Read
        lazily (the caller takes a short prefix; nothing changes during the walk)."""
        pages, sizes = self._pages, self._t1.items
        t1 = (pid for pid in sizes if not pages[pid].pinned)
        t2 = (pid for pid in self._t2.items if not pages[pid].pinned)
        a, b = next(t1, _END), next(t2, _END)
        t1_bytes = self._t1.bytes
        while a is not _END or b is not _END:
            if a is not _END and (t1_bytes > self.p or b is _END):
                t1_bytes -= sizes[a]
                yield a
                a = next(t1, _END)
            else:
                yield b
                b = next(t2, _END)

    def _trim_ghosts(self) -> None:
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        while b1.items and t1.bytes + b1.bytes > self.capacity:
            b1.pop_oldest()
        while b2.items and t1.bytes + t2.bytes + b1.bytes + b2.bytes > 2 * self.capacity:
            b2.pop_oldest()
