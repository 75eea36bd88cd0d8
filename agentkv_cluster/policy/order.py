"""Victim orders kept between evictions, so a call costs the victims it takes, not a sort.

The simulator asks for victims once per page it produces, and a model call that
brings N blocks asks N times at one ``now``: re-sorting every resident page per
call made one call quadratic. Two structures give the same order as the full
sort by the policy's rank key (same ids, same order), key for key:

- ``KeyedHeap``: a rank key that does not change with time (LRU by last access,
  semantic priority). One heap of key tuples, each ending with the page id, with
  lazy deletion: a page's live key is the one object stored for its id; any
  other copy in the heap is stale and skipped. Walking the order pops entries;
  ``restore`` pushes back the ones still live, so a walk changes nothing.
- ``NowOrder``: a rank key that depends on ``now`` (value density, TTL's
  remaining idle x size). The keys of every resident row are computed at one
  ``now`` (numpy, the policy's own column expressions) and sorted once, lazily
  (``sorted_chunks``: only as far as calls read); until the policy asks at
  another ``now`` (or under another model token), pages inserted or changed
  since are keyed at that same ``now`` and merged from a ``KeyedHeap``, and
  rows removed or changed are skipped in the sorted base.

Both compare the same Python values the full sort compares (the column values
read back with ``tolist``), with the page id breaking every tie, so the order is
the sort's. A key holding a NaN has no total order (the full sort's result then
depends on its algorithm): the structures refuse such keys (``has_nan``) and the
policy falls back to its full sort for that call.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import numpy as np

from agentkv_cluster.policy.base import PageId
from agentkv_cluster.policy.columns import RowStore

Key = tuple  # rank key values, most significant first, then the page id


def has_nan(key: Iterable[object]) -> bool:
    """True when a key value is a NaN float (no total order)."""
    return any(isinstance(v, float) and math.isnan(v) for v in key)


class KeyedHeap:
    """Rank keys ``(*values, page_id)`` in a heap with lazy deletion (module doc)."""

    def __init__(self) -> None:
        self._heap: list[Key] = []
        self._live: dict[PageId, Key] = {}
        self._taken: list[Key] = []
        self._nan: set[PageId] = set()

    def __len__(self) -> int:
        return len(self._live)

    @property
    def has_nan(self) -> bool:
        """A live key holds a NaN: its order is undefined (use the full sort)."""
        return bool(self._nan)

    def put(self, key: Key) -> None:
        """Set the page's key (the id is the key's last value)."""
        pid = key[-1]
        self._live[pid] = key
        if has_nan(key):
            self._nan.add(pid)
        else:
            self._nan.discard(pid)
        heapq.heappush(self._heap, key)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def discard(self, page_id: PageId) -> None:
        self._live.pop(page_id, None)
        self._nan.discard(page_id)

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()
        self._taken.clear()
        self._nan.clear()

    def keys(self) -> Iterator[Key]:
        """Live keys in order, popped as they are read; ``restore`` puts them back."""
        heap, live, taken = self._heap, self._live, self._taken
        while heap:
            key = heapq.heappop(heap)
            if live.get(key[-1]) is key:
                taken.append(key)
                yield key

    def ordered(self) -> Iterator[PageId]:
        return (key[-1] for key in self.keys())

    def restore(self) -> None:
        """Push back the keys a walk popped that are still live (victims are not)."""
        live = self._live
        for key in self._taken:
            if live.get(key[-1]) is key:
                heapq.heappush(self._heap, key)
        self._taken.clear()


KeyColumns = Callable[[np.ndarray, float], Sequence[np.ndarray]]


def sorted_chunks(pos: np.ndarray, cols: list[np.ndarray], head: int = 64
                  ) -> Iterator[np.ndarray]:
    """``pos`` (indices into ``cols``) in lexicographic order of ``cols`` (most
    significant first; the last one unique, the page ids), smallest first, a chunk at
    a time: only what the caller reads is sorted. A boolean key splits the rows in
    two; a numeric one yields the rows up to its ``head``-th smallest value, sorted,
    and goes on with the rest (``head`` growing fourfold, so a full read stays
    O(n log n))."""
    while len(pos):
        first = cols[0][pos]
        if len(pos) <= 4 * head or len(cols) == 1:
            yield pos[np.lexsort(tuple(c[pos] for c in reversed(cols)))]
            return
        if first.dtype == np.bool_:
            yield from sorted_chunks(pos[~first], cols[1:], head)
            pos, cols = pos[first], cols[1:]
            continue
        low = first <= np.partition(first, head)[head]
        part = pos[low]
        yield part[np.lexsort(tuple(c[part] for c in reversed(cols)))]
        pos = pos[~low]
        head *= 4


class NowOrder:
    """The order of a ``RowStore``'s rows by a time-dependent key, kept for one ``now``.

    ``key_columns(rows, now)`` returns the key columns (most significant first) of
    those rows, computed element by element (a row's values do not depend on the
    other rows). The caller reports every row it puts or drops (``touch``). With
    ``second_ask`` the order is kept only from the second call at one ``now`` (the
    first answers None: the caller's own full sort is as cheap as building it).
    """

    def __init__(self, store: RowStore, key_columns: KeyColumns, *,
                 second_ask: bool = False) -> None:
        self._store = store
        self._key_columns = key_columns
        self._second_ask = second_ask
        self._asked: Hashable | None = None  # the last token asked for, kept or not
        self._token: Hashable | None = None  # (now, model token) of the sorted base
        self._size = 0  # rows in the base
        self._ids: list[PageId] = []  # the base in order, as far as it was read
        self._cols: list[list] = []
        self._arrays: list[np.ndarray] = []  # the base's key columns and ids
        self._chunks: Iterator[np.ndarray] = iter(())
        self._start = 0
        self._changed: set[PageId] = set()  # since the base was sorted: skipped in it
        self._pending: set[PageId] = set()  # since the last walk: still to be keyed
        self._merged = KeyedHeap()
        self.rebuilds = 0  # base sorts so far (tests, benchmarks)

    def touch(self, page_id: PageId) -> None:
        """The row of ``page_id`` was put or dropped."""
        if self._token is not None:
            self._changed.add(page_id)
            self._pending.add(page_id)

    def invalidate(self) -> None:
        self._token = None
        self._size = 0
        self._ids, self._cols, self._arrays, self._chunks = [], [], [], iter(())
        self._changed.clear()
        self._pending.clear()
        self._merged.clear()

    def ordered(self, now: float, token: Hashable) -> Iterator[PageId] | None:
        """Row ids in key order at ``now``, or None when a key is NaN (no order) or
        ``second_ask`` defers; call ``restore`` after the walk."""
        token = (now, token)
        if self._token != token or len(self._changed) > self._size // 2 + 64:
            first, self._asked = self._asked != token, token
            if self._second_ask and first and self._token != token:
                self.invalidate()
                return None
            if not self._rebuild(now, token):
                return None
        elif self._pending and not self._merge(now):
            return None
        return self._walk()

    def restore(self) -> None:
        self._merged.restore()

    def _rebuild(self, now: float, token: Hashable) -> bool:
        self.invalidate()
        self.rebuilds += 1
        rows = self._store.rows()
        ids = self._store.ids[rows]
        cols = self._key_columns(rows, now)
        if any(np.isnan(c).any() for c in cols if c.dtype.kind == "f"):
            return False
        self._arrays = [*cols, ids]
        self._chunks = sorted_chunks(np.arange(len(ids)), self._arrays)
        self._ids, self._cols = [], [[] for _ in cols]
        self._size = len(ids)
        self._start = 0
        self._token = token
        return True

    def _more(self) -> bool:
        """Read the next sorted chunk of the base; False at its end."""
        chunk = next(self._chunks, None)
        while chunk is not None and not len(chunk):
            chunk = next(self._chunks, None)
        if chunk is None:
            return False
        *cols, ids = self._arrays
        self._ids.extend(ids[chunk].tolist())
        for kept, col in zip(self._cols, cols, strict=True):
            kept.extend(col[chunk].tolist())
        return True

    def _merge(self, now: float) -> bool:
        store, pending = self._store, self._pending
        live = [pid for pid in pending if store.has(pid)]
        for pid in pending:
            self._merged.discard(pid)
        pending.clear()
        if live:
            cols = self._key_columns(store.rows_of(live), now)
            for key in zip(*(c.tolist() for c in cols), live, strict=True):
                self._merged.put(key)
        if self._merged.has_nan:
            self.invalidate()
            return False
        return True

    def _walk(self) -> Iterator[PageId]:
        ids, cols, changed = self._ids, self._cols, self._changed
        i = self._start
        while (i < len(ids) or self._more()) and ids[i] in changed:
            i += 1
        self._start = i
        merged = self._merged.keys()
        head = next(merged, None)
        while True:
            while (i < len(ids) or self._more()) and ids[i] in changed:
                i += 1
            if i < len(ids):
                base = (*(c[i] for c in cols), ids[i])
                if head is None or base < head:
                    i += 1
                    yield base[-1]
                    continue
            if head is None:
                return
            yield head[-1]
            head = next(merged, None)
