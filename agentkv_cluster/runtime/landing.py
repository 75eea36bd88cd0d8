"""One-hop restores: arena pages an HBM actor sets aside so a pool can push into them.

A restore through the HBM actor costs two Ray hops: executor -> HBM actor -> pool, which
opens the sealed copy and pushes it by NIXL. For a FULL copy the bytes need no decoding
in the HBM actor, so the executor can hold a few free arena pages in advance (``reserve``)
and ask the pool to push straight into one: one hop. The HBM actor learns which key
landed there from a ``land`` call sent alongside the push, and the restore returns only
after that call answered, so the page is known to its actor before anyone is told it is
resident. Reserved pages can be landed or given back only by the executor that reserved
them, so a pool never writes through such a span into a page that holds something else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentkv_cluster.runtime.mover import lease_end, unanswered
from agentkv_cluster.runtime.records import PageMeta, RestoreReceipt
from store.hbm import PageTooLarge
from store.types import Codec

if TYPE_CHECKING:
    from agentkv_cluster.runtime.handles import HbmHandle, PoolHandle


@dataclass(slots=True)
class _Stock:
    handle: HbmHandle  # the HBM actor these pages belong to (a replaced actor took them along)
    pages: list[tuple[int, tuple]] = field(default_factory=list)  # (page, span wire)
    refilling: bool = False


class LandingPages:
    """Per HBM actor, a small stock of reserved arena pages; restores FULL copies into them."""

    def __init__(self, owner: str, per_hbm: int = 8,
                 background: Callable[[Callable[[], None]], Any] | None = None) -> None:
        self.owner = owner
        self.per_hbm = per_hbm
        self._background = background or (lambda job: job())
        self._stock: dict[str, _Stock] = {}
        self._lock = threading.Lock()
        self.one_hop = 0
        self.two_hop = 0

    def restore(self, name: str, hbm: HbmHandle, pool: PoolHandle, pool_name: str,
                meta: PageMeta, tier: int, codec: int) -> RestoreReceipt:
        """Restore ``meta``'s (tier, codec) copy from ``pool`` into HBM actor ``name``: one
        hop into a landing page when the copy is FULL and a page is in stock, else through
        the HBM actor (which decodes compressed copies itself)."""
        landing = self._take(name, hbm) if Codec(codec) is Codec.FULL else None
        if landing is None:
            self.two_hop += 1
            return hbm.restore(meta, tier, codec, pool_name)
        page, wire = landing
        if meta.length > wire[4]:  # never push past the page into its neighbour
            with contextlib.suppress(Exception):
                hbm.release_landing([page], self.owner)
            raise PageTooLarge(f"a {meta.length} B page does not fit a {wire[4]} B arena page")
        landed = hbm.start_land(meta.key, page, meta.length, self.owner)
        expires = lease_end(pool.timeout_s)  # the push may start while we wait, not after
        try:
            got = pool.restore_to(meta.key, meta.digest, int(codec),
                                  (*wire[:4], meta.length, expires))
        except BaseException as exc:
            self._undo(hbm, meta.key, page, landed, expires if unanswered(exc) else None)
            raise
        landed()
        self.one_hop += 1
        return RestoreReceipt(tier=int(got.tier), codec=int(codec), link_bytes=got.nbytes,
                              exact=True)

    def release(self) -> int:
        """Give every stocked page back, zeroed (the executor is closing, or a tenant was
        erased: a page in stock may still hold bytes of a page dropped before it was
        reserved). Returns how many pages the actors took back; the next restore restocks."""
        with self._lock:
            stocks, self._stock = list(self._stock.values()), {}
        given = 0
        for stock in stocks:
            if stock.pages:
                with contextlib.suppress(Exception):  # a dead actor took its pages along
                    given += stock.handle.release_landing([p for p, _ in stock.pages],
                                                          self.owner)
        return given

    def _take(self, name: str, hbm: HbmHandle) -> tuple[int, tuple] | None:
        with self._lock:
            stock = self._stock.get(name)
            if stock is None or stock.handle is not hbm:
                stock = self._stock[name] = _Stock(hbm)
            got = stock.pages.pop() if stock.pages else None
            refill = len(stock.pages) <= self.per_hbm // 2 and not stock.refilling
            stock.refilling = stock.refilling or refill
        if refill:
            self._background(lambda: self._refill(stock))
        return got

    def _refill(self, stock: _Stock) -> None:
        try:  # the actor caps its reservations, counting pages taken but not yet landed
            got = stock.handle.reserve(self.per_hbm - len(stock.pages), self.owner)
        except Exception:  # noqa: BLE001 - no stock: restores take the two-hop path
            got = []
        with self._lock:
            current = any(s is stock for s in self._stock.values())
            if current:
                stock.pages.extend((int(p), tuple(w)) for p, w in got)
            stock.refilling = False
        if got and not current:  # ``release`` ran meanwhile: these go back too
            with contextlib.suppress(Exception):
                stock.handle.release_landing([int(p) for p, _ in got], self.owner)

    def _undo(self, hbm: HbmHandle, key: bytes, page: int, landed: Callable[[], Any],
              unanswered: float | None) -> None:
        """The push failed: free the page, whichever side of ``land`` it is on (an actor
        that died took it along). When the pool did not answer (``unanswered``: the end of
        the lease the push ran under) it may still push into the page: the HBM actor
        holds the page out of use past the lease instead (``ArenaPages.hold``)."""
        try:
            landed()
            reserved = False
        except Exception:  # noqa: BLE001 - not landed: it is still reserved
            reserved = True
        with contextlib.suppress(Exception):
            if unanswered is not None:
                hbm.hold(key, unanswered, page, self.owner)
            elif reserved:
                hbm.release_landing([page], self.owner)
            else:
                hbm.drop(key, scrub=True)  # what the push left, over what the page held
