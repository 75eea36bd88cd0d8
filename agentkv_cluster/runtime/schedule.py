"""Moves planned for later: gap migrations, gap prefetches and refills, by start time.

A plain priority queue of ``Action``s keyed by ``start_at`` (ties in the order pushed),
with the one operation the page manager needs besides push and pop: cancel the moves of
some pages (their session resumed, their tenant is erased). Pure: no clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

from agentkv_cluster.runtime.records import Action, ActionKind


class MoveSchedule:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Action]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[tuple[float, Action]]:
        """(start time, action) of every scheduled action, in no particular order."""
        return ((at, action) for at, _seq, action in self._heap)

    def push(self, action: Action, at: float | None = None) -> None:
        """Run ``action`` at ``at`` (default: its ``start_at``)."""
        heapq.heappush(self._heap, (action.start_at if at is None else at,
                                    next(self._seq), action))

    def pop_due(self, now: float) -> Iterator[Action]:
        """Take out, earliest first, every action whose time has come (one at a time:
        an action pushed back while iterating is seen again only if it is due)."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]

    def next_due(self) -> float | None:
        """When the earliest scheduled action starts (None: nothing scheduled)."""
        return self._heap[0][0] if self._heap else None

    def cancel(self, gids: Iterable[int],
               kinds: tuple[ActionKind, ...] = (ActionKind.DEMOTE,)) -> int:
        """Drop the scheduled actions of ``kinds`` on pages ``gids``; returns how many."""
        drop = set(gids)
        kept = [item for item in self._heap
                if not (item[2].gid in drop and item[2].kind in kinds)]
        cancelled = len(self._heap) - len(kept)
        if cancelled:
            heapq.heapify(kept)
            self._heap = kept
        return cancelled
