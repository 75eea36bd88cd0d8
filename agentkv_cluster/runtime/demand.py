"""Demand hints: which pages an engine wants in HBM now or soon.

A load waiting for its pages (``want``), a prefetch that fell due while its page was still
moving out (``recalled``), and the pages of a session whose tool call has returned, until
the engine loads them or the next tool starts (``returning``). The transfer worker asks
``wanted``: a background move of a wanted page gives way to the engine (see executor),
and a pressure demotion spares it while others free enough. The page table keeps one
``Demand``, changed under the controller's lock; it is a hint, never a pin.
"""

from __future__ import annotations

from collections import Counter


class Demand:
    """Pages wanted in HBM, by gid."""

    def __init__(self) -> None:
        self.waiting: Counter[int] = Counter()  # loads waiting per page (no zeros kept)
        self.recalled: set[int] = set()
        self.returning: set[int] = set()

    def want(self, gids: list[int], step: int) -> None:
        """An engine waits for ``gids`` (step 1) or stopped waiting (-1)."""
        for g in gids:
            self.waiting[g] += step
            if self.waiting[g] <= 0:
                del self.waiting[g]

    def wanted(self, gid: int) -> bool:
        """An engine waits for this page now, or will as soon as its session resumes."""
        return self.waiting.get(gid, 0) > 0 or gid in self.recalled or gid in self.returning

    def gids(self) -> set[int]:
        """Every page wanted now or soon."""
        return self.waiting.keys() | self.recalled | self.returning

    def forget(self, gid: int) -> None:
        """The page is gone (retired or erased); a load's ``want(-1)`` still balances."""
        self.returning.discard(gid)
        self.recalled.discard(gid)
