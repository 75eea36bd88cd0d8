"""Will a silent page come back? Learned online from how idle gaps ended.

Every idle gap of a page ends in one of two ways the caller observes: the page
is read again (a *return*, after ``idle_s``) or its end-of-life signal arrives
(an *end*, after ``silent_s`` of silence). ``ReturnModel`` keeps the last
``window`` outcomes per key (tool class, state type) and answers, for a page
that has been silent for ``elapsed`` seconds,

    P(return | silent through elapsed) = returns that lasted longer than elapsed
                                         / all gaps that lasted longer than elapsed

(the empirical competing-risks estimate), shrunk toward the page's own reuse
estimate by ``prior`` pseudo-outcomes. Gaps still open (``open_gap``: begun, not
yet ended either way) that have lasted longer than ``elapsed`` count in the
denominator: an end is often known only long after the gap began (a session that
just stops is declared over after an idle timeout), so outcomes seen so far
over-represent quick returns, and an open gap is not yet a return. It never sees
the future: only outcomes already observed, open gaps as of ``now``, and the
elapsed silence of the page itself. Where the
orchestrator signals dead pages inside the gap (the paper's workload), the
silent pages that remain are mostly ones that will be read, so P rises with
elapsed time; where a session that just stops is declared over only after an
idle timeout (conversation traces), P falls with elapsed time.

``ReturnModel.worth_prefetching`` is the cost-aware prefetch rule: a prefetch
pays ``restore_s`` of link time whether or not the page is read, and saves that
much visible delay only if it is read; displacing resident bytes adds their
share. Prefetch when delay_weight x P x restore_s >= (1 - P) x restore_s x
(1 + displacement_weight x displaced share).
Pure: no clock reads; ``now`` and durations are passed in.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from agentkv_cluster.policy.base import PageView

ReturnKey = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class ReturnConfig:
    window: int = 1024  # outcomes kept per key (the oldest is forgotten first)
    prior: float = 8.0  # pseudo-outcomes at the page's own reuse estimate
    min_outcomes: int = 32  # below this many outcomes in all, ``trained`` is False
    displacement_weight: float = 1.0  # cost of displaced bytes per byte prefetched
    delay_weight: float = 1.0  # a second of restore hidden vs a second of link wasted

    def __post_init__(self) -> None:
        if self.window < 1 or self.prior < 0 or self.min_outcomes < 0:
            raise ValueError("window >= 1, prior >= 0 and min_outcomes >= 0 required")
        if self.displacement_weight < 0 or self.delay_weight <= 0:
            raise ValueError("displacement_weight >= 0 and delay_weight > 0 required")


class _Outcomes:
    """The last ``window`` gap outcomes of one key, as two sorted duration lists."""

    __slots__ = ("ends", "order", "returns", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.order: deque[tuple[float, bool]] = deque()
        self.returns: list[float] = []
        self.ends: list[float] = []

    def add(self, duration: float, returned: bool) -> None:
        if len(self.order) == self.window:
            old, was = self.order.popleft()
            lst = self.returns if was else self.ends
            del lst[bisect.bisect_left(lst, old)]
        self.order.append((duration, returned))
        bisect.insort(self.returns if returned else self.ends, duration)

    def beyond(self, elapsed: float) -> tuple[int, int]:
        """(returns, ends) among the gaps that lasted longer than ``elapsed``."""
        r = len(self.returns) - bisect.bisect_right(self.returns, elapsed)
        e = len(self.ends) - bisect.bisect_right(self.ends, elapsed)
        return r, e


class ReturnModel:
    """Online P(a silent page is read again) per (tool class, state type)."""

    def __init__(self, config: ReturnConfig | None = None) -> None:
        self.config = config or ReturnConfig()
        self._by: dict[ReturnKey, _Outcomes] = {}
        self._open: dict[object, tuple[ReturnKey, float]] = {}  # page -> (key, gap start)
        self._open_starts: dict[ReturnKey, list[float]] = {}  # sorted, per key
        self.observed = 0

    def open_gap(self, page: PageView, started: float) -> None:
        """The page began an idle gap at ``started`` (replaces its open gap, if any)."""
        self._close(page.page_id)
        k = self.key(page)
        self._open[page.page_id] = (k, started)
        bisect.insort(self._open_starts.setdefault(k, []), started)

    def close_open_gaps(self, now: float) -> int:
        """Every open gap ends at ``now`` without a return (the workload stops: its
        pages were never read again); returns how many."""
        n = 0
        for pid, (k, started) in list(self._open.items()):
            self._close(pid)
            self._add(k, max(0.0, now - started), False)
            n += 1
        return n

    def forget(self, page_id: object) -> bool:
        """Drop the page's open gap without an outcome (its tenant was erased: nothing is
        learned from it and nothing of it stays); returns whether it had one. Left open,
        it would count against every page of its kind as a gap that never ended."""
        return self._close(page_id) is not None

    def forget_tool(self, tool_class: str) -> None:
        """Drop the outcomes learned for ``tool_class`` (its only user was erased); its
        pages' open gaps were dropped with them (``forget``)."""
        for k in [k for k in self._by if k[0] == tool_class]:
            del self._by[k]
        for k in [k for k in self._open_starts if k[0] == tool_class]:
            del self._open_starts[k]

    def _close(self, page_id: object) -> tuple[ReturnKey, float] | None:
        rec = self._open.pop(page_id, None)
        if rec is not None:
            starts = self._open_starts[rec[0]]
            del starts[bisect.bisect_left(starts, rec[1])]
        return rec

    @staticmethod
    def key(page: PageView) -> ReturnKey:
        return (page.tool_class, page.state_type.value)

    @property
    def trained(self) -> bool:
        return self.observed >= self.config.min_outcomes

    def observe_return(self, page: PageView, idle_s: float) -> None:
        """The page was read again after ``idle_s`` of silence."""
        self._observe(page, idle_s, True)

    def observe_end(self, page: PageView, silent_s: float) -> None:
        """The page's end-of-life signal arrived after ``silent_s`` of silence."""
        self._observe(page, silent_s, False)

    def _observe(self, page: PageView, duration: float, returned: bool) -> None:
        if not duration >= 0.0:
            raise ValueError(f"page {page.page_id}: gap duration {duration} must be >= 0")
        rec = self._close(page.page_id)
        self._add(rec[0] if rec is not None else self.key(page), duration, returned)

    def _add(self, k: ReturnKey, duration: float, returned: bool) -> None:
        box = self._by.get(k)
        if box is None:
            box = self._by[k] = _Outcomes(self.config.window)
        box.add(duration, returned)
        self.observed += 1

    def p_return(self, page: PageView, now: float) -> float:
        """P(the page is read again | silent from ``last_access`` through ``now``)."""
        elapsed = max(0.0, now - page.last_access)
        k = self.key(page)
        box = self._by.get(k)
        r, e = box.beyond(elapsed) if box is not None else (0, 0)
        starts = self._open_starts.get(k)
        if starts:  # open gaps silent at least as long as this page (itself excluded)
            cut = min(now, page.last_access)
            e += bisect.bisect_right(starts, cut)
            rec = self._open.get(page.page_id)
            if rec is not None and rec[0] == k and rec[1] <= cut:
                e -= 1
        prior = self.config.prior
        return (r + prior * page.reuse_prob) / (r + e + prior) if r + e + prior > 0 else 0.0

    def worth_prefetching(self, page: PageView, now: float, restore_s: float,
                          displaced_bytes: int = 0) -> bool:
        """The cost-aware prefetch rule (module doc)."""
        p = self.p_return(page, now)
        share = displaced_bytes / page.size_bytes if page.size_bytes else 0.0
        cost = restore_s * (1.0 + self.config.displacement_weight * share)
        return self.config.delay_weight * p * restore_s >= (1.0 - p) * cost


__all__ = ["ReturnConfig", "ReturnKey", "ReturnModel"]
