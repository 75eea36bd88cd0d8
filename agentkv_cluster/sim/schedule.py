"""The event loop's queue: a batch's events in (time, kind, sequence) order, each made
only when it can come next.

Every event has a key ``(time, kind, sequence)`` and the loop handles events in key
order; sequence numbers are unique, so no two keys tie. They are numbered as if
every page's events were queued up front, page after page: page ``i``'s production,
then its reads in order, then its end-of-life signal (if it has one), then its
false signal (if any); events the loop schedules while it runs (prefetches) are
numbered after all of those, in the order they are scheduled.

The queue holds only what can come next: the next page to be produced, and for
each produced page its next read and its signals. A page's later read enters when
the read before it leaves (its key is larger: reads are sorted and numbered in
order), its reads and signals when it is produced. So the loop sees exactly the
order a queue of every event would give, holding about one entry per live page
instead of one per read. A signal timed before its page's production is dropped:
the loop would find no page to act on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from agentkv_cluster.sim.workload import Batch, Ragged, offsets_of

# Event kinds; the integer orders same-time events (produce, read, signals, prefetch).
CREATE, ACCESS, EOL, FALSE, PREFETCH = 0, 1, 2, 3, 4

Event = tuple[float, int, int, int, int]  # (time, kind, sequence, page, token)


class UnorderedBatch(ValueError):
    """A batch whose reads are not sorted per page, come before their page is produced,
    or whose times are not numbers (``Batch.access_times``: sorted reuse times)."""


def _flat_reads(reads: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every page's reads as one float array and offsets (``Ragged``'s layout)."""
    if isinstance(reads, Ragged):
        return np.asarray(reads.values, dtype=np.float64), np.asarray(reads.offsets, np.int64)
    counts = np.array([len(r) for r in reads], dtype=np.int64)
    values = (np.concatenate([np.asarray(r, dtype=np.float64).ravel() for r in reads])
              if counts.sum() else np.zeros(0))
    return values, offsets_of(counts)


def _check(created: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> None:
    if np.isnan(created).any():
        raise UnorderedBatch(f"page {int(np.flatnonzero(np.isnan(created))[0])}: "
                             f"its creation time is not a number")
    counts = np.diff(offsets)
    page = np.repeat(np.arange(counts.size), counts)
    before = ~(values >= created[page])  # NaN reads fail too
    if before.any():
        j = int(np.flatnonzero(before)[0])
        raise UnorderedBatch(f"page {int(page[j])}: read at {float(values[j])!r} before it is "
                             f"produced at {float(created[page[j]])!r}")
    later = ~(values[1:] >= values[:-1]) & (page[1:] == page[:-1])
    if later.any():
        j = int(np.flatnonzero(later)[0])
        raise UnorderedBatch(f"page {int(page[j])}: reads not sorted "
                             f"({float(values[j])!r} then {float(values[j + 1])!r})")


class EventQueue:
    """The batch's events in key order (module doc); ``pop`` makes the popped event's
    successors, ``push_prefetch`` adds a prefetch. ``peak``: most entries held at once."""

    def __init__(self, batch: Batch) -> None:
        created = np.asarray(batch.created, dtype=np.float64)
        self._created = created
        self._reads, self._offsets = _flat_reads(batch.access_times)
        _check(created, self._reads, self._offsets)
        signal = batch.signal_at if batch.signal_at is not None else batch.eol
        self._signal = np.asarray(signal, dtype=np.float64)
        false = batch.false_signal_at
        self._false = None if false is None else np.asarray(false, dtype=np.float64)
        n_reads = np.diff(self._offsets)
        has_signal = np.isfinite(self._signal)
        has_false = (np.isfinite(self._false) if self._false is not None
                     else np.zeros(created.size, dtype=bool))
        counts = 1 + n_reads + has_signal + has_false
        self._first_seq = np.cumsum(counts) - counts + 1  # of each page's production
        self._seq = int(counts.sum())  # the last sequence number handed out
        self._order = np.argsort(created, kind="stable")  # production order
        self._next = 0  # index into _order of the next page to produce
        # the loop reads one number at a time: through memoryviews, as Python numbers
        self._c, self._r, self._o, self._s, self._q, self._p = (
            memoryview(np.ascontiguousarray(a)) for a in (
                created, self._reads, self._offsets, self._signal, self._first_seq,
                self._order))
        self._f = None if self._false is None else memoryview(np.ascontiguousarray(self._false))
        self._heap: list[Event] = []
        self.peak = 0
        self._produce_next()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def reads(self, page: int) -> int:
        return self._o[page + 1] - self._o[page]

    def due(self, page: int) -> int:
        """The events the page gets once produced: its reads and the signals timed from
        its production on."""
        t, sig = self._c[page], self._s[page]
        n = self.reads(page) + (math.isfinite(sig) and sig >= t)
        if self._f is not None:
            n += math.isfinite(self._f[page]) and self._f[page] >= t
        return n

    def push_prefetch(self, t: float, page: int, token: int) -> None:
        self._seq += 1
        self._push((t, PREFETCH, self._seq, page, token))

    def pop(self) -> Event:
        ev = heapq.heappop(self._heap)
        t, kind, seq, page, token = ev
        if kind == CREATE:
            self._produce_next()
            self._schedule(page, t, seq)
        elif kind == ACCESS:
            k = token + 1  # an ACCESS event's token is its read's index
            j = self._o[page] + k
            if j < self._o[page + 1]:
                self._push((self._r[j], ACCESS, seq + 1, page, k))
        return ev

    def _push(self, ev: Event) -> None:
        heapq.heappush(self._heap, ev)
        self.peak = max(self.peak, len(self._heap))

    def _produce_next(self) -> None:
        if self._next < len(self._p):
            i = self._p[self._next]
            self._next += 1
            self._push((self._c[i], CREATE, self._q[i], i, 0))

    def _schedule(self, page: int, created: float, seq: int) -> None:
        """A produced page's first read and its signals (module doc: their numbers)."""
        n = self.reads(page)
        if n:
            self._push((self._r[self._o[page]], ACCESS, seq + 1, page, 0))
        seq += n
        t = self._s[page]
        if math.isfinite(t):
            seq += 1
            if t >= created:
                self._push((t, EOL, seq, page, 0))
        if self._f is not None:
            t = self._f[page]
            if math.isfinite(t):
                seq += 1
                if t >= created:
                    self._push((t, FALSE, seq, page, 0))
