"""Numpy columns of a policy's resident pages, kept up to date row by row.

The sort-based baselines (TTL, semantic) rank every resident page on every
eviction. Above a few hundred pages, building the keys per page in Python
dominates a simulation; these columns let the same keys be computed in one
vectorised pass. Rows are written on insert and on every access/update the
policy is told about, and freed on removal; the ranking they give is the same
as the per-page path's (same floating-point expressions, same tie-breaks;
tests compare both).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from agentkv_cluster.policy.base import PageId

# From this many resident pages the columnar ranking is used (numpy's fixed cost per
# call dominates below it).
COLUMNAR_MIN_PAGES = 256


class RowStore:
    """Float columns named at construction, plus page ids; one row per tracked page."""

    def __init__(self, fields: tuple[str, ...], capacity: int = 64) -> None:
        self._fields = fields
        self.cols = {f: np.zeros(capacity) for f in fields}
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.alive = np.zeros(capacity, dtype=np.bool_)
        self._row: dict[PageId, int] = {}
        self._free: list[int] = []
        self._top = 0  # rows in use or freed so far

    def put(self, page_id: PageId, values: tuple[float, ...]) -> None:
        row = self._row.get(page_id)
        if row is None:
            row = self._alloc()
            self._row[page_id] = row
            self.ids[row] = page_id
            self.alive[row] = True
        for f, v in zip(self._fields, values, strict=True):
            self.cols[f][row] = v

    def drop(self, page_id: PageId) -> None:
        row = self._row.pop(page_id, None)
        if row is not None:
            self.alive[row] = False
            self._free.append(row)

    def rows(self) -> np.ndarray:
        return np.flatnonzero(self.alive[: self._top])

    def has(self, page_id: PageId) -> bool:
        return page_id in self._row

    def rows_of(self, page_ids: list[PageId]) -> np.ndarray:
        """The rows of ``page_ids`` (each must be stored), in that order."""
        return np.fromiter(map(self._row.__getitem__, page_ids), dtype=np.int64,
                           count=len(page_ids))

    def clear(self) -> None:
        self.alive[:] = False
        self._row.clear()
        self._free.clear()
        self._top = 0

    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        if self._top == len(self.ids):
            grow = len(self.ids)
            for f in self._fields:
                self.cols[f] = np.concatenate([self.cols[f], np.zeros(grow)])
            self.ids = np.concatenate([self.ids, np.zeros(grow, dtype=np.int64)])
            self.alive = np.concatenate([self.alive, np.zeros(grow, dtype=np.bool_)])
        self._top += 1
        return self._top - 1


def lexsorted_ids(ids: np.ndarray, keys: tuple[np.ndarray, ...], head: int = 32
                  ) -> Iterator[PageId]:
    """``ids`` in ``np.lexsort(keys)`` order (last key most significant), lazily: the
    rows whose primary key is within the ``head`` smallest are sorted first, the rest
    only if the caller reads that far (eviction takes a short prefix)."""
    primary = keys[-1]
    if len(primary) <= 4 * head:
        yield from ids[np.lexsort(keys)].tolist()
        return
    kth = np.partition(primary, head)[head]
    for part in (np.flatnonzero(primary <= kth), np.flatnonzero(primary > kth)):
        sub = tuple(k[part] for k in keys)
        yield from ids[part][np.lexsort(sub)].tolist()
