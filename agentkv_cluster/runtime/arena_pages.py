"""Which arena page holds which key, and when a page may be given to another one.

The HBM actor's arena pages are read and written by transfers that run outside any lock
(NIXL pushes and pulls, by this actor or by a peer through a span it was lent) and by the
codecs. A page must not be given to another key while such a transfer may still touch it,
or one page's bytes land in, or are read from, another's, possibly another tenant's.
``ArenaPages`` keeps the rules in one place:

- a page being read (``reading``: a serve's pushes, a demotion's encoding) or written
  (``writing``: an ingest's pull, a restore's push or decode) is pinned; one released
  meanwhile (a drop, an erasure, a reset) leaves its key at once and is freed when the
  last pin goes;
- a page whose transfer may still run after its call ended (the peer did not answer, or
  the transfer itself did not end: ``ActorGone``) is held until ``LEASE_GRACE_S`` past the
  lease it was lent under, then freed zeroed (``hold``);
- landing pages are reserved for one owner (``reserve``), who alone can land or return
  them.

Thread-safe: one lock, whose condition also wakes an allocation waiting for a page.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from agentkv_cluster.runtime.handles import DEFAULT_TIMEOUT_S
from agentkv_cluster.runtime.mover import Held, lease_end, unanswered
from agentkv_cluster.runtime.records import UnknownPageKey
from store.hbm import ArenaFull, HbmArena

ALLOC_WAIT_S = 2.0  # how long a page allocation waits for a drop on its way (``alloc``)


class ArenaPages:
    """The key -> page map of one ``HbmArena``, its pins, held pages and reservations."""

    def __init__(self, arena: HbmArena, landing_pages: int) -> None:
        self.arena = arena
        self.landing_pages = landing_pages
        self._pages: dict[bytes, int] = {}  # key -> arena page
        self._landing: dict[int, str] = {}  # arena page -> owner that reserved it
        self._held: Held[int] = Held()  # pages: see ``hold``
        self._stuck: Held[int] = Held()  # pages a stalled read keeps pinned
        self._unread: dict[int, bool] = {}  # released while pinned -> zero it when freed
        self._lock = threading.Condition(threading.Lock())

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"pages": len(self._pages), "landing_pages": len(self._landing),
                    "held_pages": len(self._held) + len(self._stuck)}

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._pages)

    def page(self, key: bytes) -> int:
        page = self._pages.get(key)
        if page is None:
            raise UnknownPageKey("page is not resident in this HBM actor")
        return page

    # -- allocation and release ---------------------------------------------------------------
    def alloc(self, key: bytes) -> int:
        """An arena page for ``key`` (its old page, if any, is released first). When none is
        free this waits (at most ``ALLOC_WAIT_S``) for one: the manager's budget already
        counts the room a drop on its way will free (a page a load took back, a victim
        still being copied out)."""
        with self._lock:
            self._release(key)
            deadline = time.monotonic() + ALLOC_WAIT_S
            while True:
                self._reclaim()
                try:
                    page = self.arena.alloc()
                    break
                except ArenaFull:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise
                waiting = self._held or self._stuck  # they come back by the clock
                self._lock.wait(min(left, 0.25) if waiting else left)
            self._pages[key] = page
            return page

    def release(self, key: bytes, scrub: bool = False) -> bool:
        """Free ``key``'s page, if it has one; ``scrub`` zeroes it too."""
        with self._lock:
            return self._release(key, scrub)

    def _release(self, key: bytes, scrub: bool = False) -> bool:
        page = self._pages.pop(key, None)
        if page is not None:
            self._free(page, scrub)
        return page is not None

    def _free(self, page: int, scrub: bool) -> None:
        """Free a page now, or once its pins are gone (the caller holds the lock)."""
        if self.arena.is_pinned(page):
            self._unread[page] = self._unread.get(page, False) or scrub
            return
        self.arena.free(page, scrub=scrub)
        self._lock.notify_all()

    def _unpin(self, page: int) -> None:
        self.arena.unpin(page)
        if page in self._unread and not self.arena.is_pinned(page):
            self._free(page, self._unread.pop(page))

    # -- transfers in flight ------------------------------------------------------------------
    @contextmanager
    def reading(self, keys: list[bytes]) -> Iterator[list[int]]:
        """The pages of resident ``keys``, pinned while the caller reads them. Raises
        ``UnknownPageKey`` (nothing pinned) if a key is not resident. When the read ends in
        ``ActorGone`` (a push that did not end: ``TransferStalled``) the pins stay until
        ``LEASE_GRACE_S`` from now: NIXL may still read the pages."""
        with self._lock:
            pages = [self.page(key) for key in keys]
            for page in pages:
                self.arena.pin(page)
        stalled = False
        try:
            yield pages
        except BaseException as exc:
            stalled = unanswered(exc)
            raise
        finally:
            with self._lock:
                if stalled:
                    for page in pages:
                        self._stuck.add(page, 0.0)
                else:
                    for page in pages:
                        self._unpin(page)

    @contextmanager
    def writing(self, key: bytes, page: int, length: int, lent: float | None) -> Iterator[None]:
        """``page``, just allocated for ``key``, pinned while bytes are written into it: by
        this actor, or by a peer through a span lent until ``lent`` (``None``: written
        here only; 0.0: by a transfer this actor started). Marked written if it still
        holds ``key``. On an error the page leaves its key, zeroed; when the transfer may
        still write it (``ActorGone`` with ``lent`` given) it is held instead."""
        with self._lock:
            self.arena.pin(page)
        try:
            yield
        except BaseException as exc:
            with self._lock:
                if self._pages.get(key) == page:
                    del self._pages[key]
                    self._unread[page] = True
                if lent is not None and unanswered(exc):
                    self._unread.pop(page, None)
                    self.arena.unpin(page)
                    self._held.add(page, lent)
                else:
                    self._unpin(page)
            raise
        with self._lock:
            if self._pages.get(key) == page:
                self.arena.mark_written(page, length)
            self._unpin(page)

    def hold(self, key: bytes, expires: float, page: int, owner: str) -> bool:
        """Take landing ``page`` out of use until ``LEASE_GRACE_S`` past ``expires``: a pool
        that did not answer may still push into it. It is still reserved by ``owner``, or
        landed as ``key``, or released and waiting for its pins to go; it comes back zeroed."""
        with self._lock:
            if self._landing.get(page) == owner:
                del self._landing[page]
            elif self._pages.get(key) == page:
                del self._pages[key]
            elif page in self._unread:
                del self._unread[page]
            else:  # freed already: nothing to hold
                return False
            self._held.add(page, expires)
            return True

    def _reclaim(self) -> None:
        """Free the held pages whose time is up, zeroed, and drop the pins a stalled read
        left once theirs is (the caller holds the lock)."""
        for page in self._stuck.due():
            self._unpin(page)
        for page in self._held.due():
            if self.arena.is_pinned(page):  # a read pinned it meanwhile: freed after it
                self._unread[page] = True
            else:
                self._free(page, scrub=True)

    # -- erasure and takeover -----------------------------------------------------------------
    def purge(self, keys: list[bytes]) -> tuple[int, int]:
        """Free and zero these pages, zero every free and held page; returns (pages of
        ``keys`` held here, free pages zeroed). A page still pinned is zeroed as its pins go
        (every such page: one released unscrubbed before may hold the erased tenant's bytes)."""
        with self._lock:
            n = sum(self._release(key, scrub=True) for key in keys)
            for page in self._unread:
                self._unread[page] = True
            for page in self._held:  # zeroed now, and again when they come back
                self.arena.zero(page)
            return n, self.arena.scrub_free()

    def reset(self) -> int:
        """Drop every page and landing reservation (a new controller takes over; the old
        one's executor held the reservations, and pools may still push into them for as
        long as its calls could wait: those are held)."""
        with self._lock:
            n = len(self._pages)
            for page in self._pages.values():
                self._free(page, scrub=False)
            expires = lease_end(DEFAULT_TIMEOUT_S)
            for page in self._landing:
                self._held.add(page, expires)
            self._pages.clear()
            self._landing.clear()
            return n

    # -- landing pages ------------------------------------------------------------------------
    def reserve(self, n: int, owner: str) -> list[int]:
        """Up to ``n`` free pages set aside for ``owner`` (never more than ``landing_pages``
        reserved at once)."""
        out: list[int] = []
        with self._lock:
            self._reclaim()
            while n > len(out) and len(self._landing) < self.landing_pages:
                try:
                    page = self.arena.alloc()
                except ArenaFull:
                    break
                self._landing[page] = owner
                out.append(page)
        return out

    def land(self, key: bytes, page: int, length: int, owner: str) -> None:
        with self._lock:
            if self._landing.get(page) != owner:
                raise UnknownPageKey(f"arena page {page} is not reserved by {owner}")
            del self._landing[page]
            self._release(key)
            self._pages[key] = page
            self.arena.mark_written(page, length)

    def release_landing(self, pages: list[int], owner: str) -> int:
        with self._lock:
            mine = [p for p in pages if self._landing.get(p) == owner]
            for page in mine:
                del self._landing[page]
                self._free(page, scrub=True)  # old bytes, or part of a failed push
            return len(mine)
