"""Shared bookkeeping of every eviction policy: the resident set, exact-victim selection.

``TrackedPolicy`` tracks the pages resident in the fast tier and implements the
``EvictionPolicy`` interface around one hook, ``_victim_order`` (every tracked
page in victim order); a policy that keeps its order between calls also gives
``_victim_walk`` (read by ``select_victims``, followed by ``_order_done``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from agentkv_cluster.policy.base import (
    DuplicatePage,
    EndOfLife,
    PageId,
    PageView,
    RetireDecision,
    UnknownPage,
)


class TrackedPolicy:
    """Shared bookkeeping: the resident set and exact-victim selection."""

    name = "tracked"

    def __init__(self, *, signals: Iterable[EndOfLife] = ()) -> None:
        self._pages: dict[PageId, PageView] = {}
        self._bytes = 0
        self.signals: frozenset[EndOfLife] = frozenset(signals)
        for s in self.signals:
            if not isinstance(s, EndOfLife):
                raise TypeError(f"{self.name}: signals must be EndOfLife members, got {s!r}")

    # -- interface
    def on_insert(self, page: PageView, now: float) -> None:
        page.validate()
        if page.page_id in self._pages:
            raise DuplicatePage(f"{self.name}: page {page.page_id} is already tracked")
        self._pages[page.page_id] = page
        self._bytes += page.size_bytes
        self._inserted(page, now)

    def on_access(self, page: PageView, now: float) -> None:
        self._require(page.page_id)
        self._replace(page)
        self._accessed(page, now)

    def on_update(self, page: PageView, now: float) -> None:
        self._require(page.page_id)
        page.validate()
        self._replace(page)

    def on_remove(self, page_id: PageId) -> None:
        self._require(page_id)
        self._bytes -= self._pages.pop(page_id).size_bytes
        self._removed(page_id)

    def select_victims(self, need_bytes: int, now: float) -> list[PageId]:
        if need_bytes < 0:
            raise ValueError(f"need_bytes must be >= 0, got {need_bytes}")
        if need_bytes == 0:
            return []
        try:
            victims = take_exactly(self._victim_walk(now), self._pages, need_bytes)
            for page_id in victims:
                self._bytes -= self._pages.pop(page_id).size_bytes
                self._evicted(page_id)
        finally:
            self._order_done()
        return victims

    def resident_bytes(self) -> int:
        return self._bytes

    def on_consumers_done(self, page: PageView, now: float, *, retirable: bool = True,
                          signal: EndOfLife = EndOfLife.TASK_END) -> RetireDecision:
        """The orchestrator reports the page's end of life (the caller has already set
        ``page.dependency``). A baseline built with ``signal`` among its ``signals``
        frees the page (stops tracking it; the caller drops every copy); otherwise it
        keeps the page and only refreshes its record when it tracks it."""
        if retirable and signal in self.signals:
            if page.page_id in self._pages:
                self.on_remove(page.page_id)
            return RetireDecision(page_id=page.page_id, retire=True,
                                  reason=f"{self.name} frees on {signal.value}")
        if page.page_id in self._pages:
            self.on_update(page, now)
        return RetireDecision(page_id=page.page_id, retire=False,
                              reason=f"{self.name} ignores {signal.value}")

    def tracked(self) -> Iterator[PageView]:
        """The tracked pages' records (callers refresh predictions in place, then tell
        the policy through ``on_update`` where its order depends on them)."""
        return iter(list(self._pages.values()))

    def __contains__(self, page_id: object) -> bool:
        return page_id in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    # -- hooks for subclasses
    def _victim_order(self, now: float) -> Iterable[PageId]:
        """Every tracked page in victim order (pinned ones included)."""
        raise NotImplementedError

    def _victim_walk(self, now: float) -> Iterable[PageId]:
        """The order ``select_victims`` reads: ``_victim_order``'s, from a structure
        kept between calls where a policy keeps one (then ``_order_done`` follows)."""
        return self._victim_order(now)

    def _inserted(self, page: PageView, now: float) -> None:
        pass

    def _accessed(self, page: PageView, now: float) -> None:
        pass

    def _removed(self, page_id: PageId) -> None:
        pass

    def _evicted(self, page_id: PageId) -> None:
        self._removed(page_id)

    def _order_done(self) -> None:
        """The walk of ``_victim_order`` is over (a kept order restores what it popped)."""

    # -- helpers
    def _require(self, page_id: PageId) -> None:
        if page_id not in self._pages:
            raise UnknownPage(f"{self.name}: page {page_id} is not tracked")

    def _replace(self, page: PageView) -> None:
        self._bytes += page.size_bytes - self._pages[page.page_id].size_bytes
        self._pages[page.page_id] = page
        self._refreshed(page)

    def _refreshed(self, page: PageView) -> None:
        """The caller reported new field values of a tracked page (access, update)."""


def take_exactly(
    order: Iterable[PageId], pages: Mapping[PageId, PageView], need_bytes: int
) -> list[PageId]:
    """Shortest prefix of ``order`` (pinned pages skipped) covering ``need_bytes``, or []."""
    victims: list[PageId] = []
    freed = 0
    for page_id in order:
        page = pages[page_id]
        if page.pinned:
            continue
        victims.append(page_id)
        freed += page.size_bytes
        if freed >= need_bytes:
            return victims
    return []
