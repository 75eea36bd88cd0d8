"""HBM page actor: one per GPU (or ``hbm_slot`` on CPU-only nodes); a shell around one arena.

It stores, serves, demotes and restores pages as the controller's actions say and
decides nothing itself. Compression runs here ("on an idle GPU stream"), so only
compressed bytes cross the link to the pool; bytes move by NIXL only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkv_cluster.runtime.actor_groups import MOVE_OUT, group
from agentkv_cluster.runtime.arena_pages import ArenaPages
from agentkv_cluster.runtime.erasure_receipts import HbmPurged
from agentkv_cluster.runtime.mover import Endpoint, Mover, RemoteSpan, lease_end, unanswered
from agentkv_cluster.runtime.records import DemoteReceipt, PageMeta, RestoreReceipt
from store.codecs import CodecInputError
from store.codecs.pages import decode_into, encode_page
from store.hbm import HbmArena, PageTooLarge
from store.types import Codec, Tier

if TYPE_CHECKING:
    from agentkv_cluster.runtime.handles import PoolHandle


@dataclass(frozen=True, kw_only=True)
class HbmSpec:
    name: str
    page_bytes: int
    num_pages: int
    device: str | None = None
    staging_slots: int = 16
    # Arena pages beyond ``num_pages`` that the controller's executor may hold as landing
    # pages for one-hop restores (see ``reserve``); the HBM budget never counts them.
    landing_pages: int = 8


class HbmActor:
    """Owns an ``HbmArena``; each page sits in one arena page, registered with NIXL."""

    def __init__(self, spec: HbmSpec) -> None:
        self.spec = spec
        self.arena = HbmArena(spec.page_bytes, spec.num_pages + spec.landing_pages, spec.device)
        self.mover = Mover(f"hbm-{spec.name}", spec.page_bytes, spec.staging_slots)
        # The whole arena is one NIXL region; a peer addresses a page at its page_offset.
        self._whole = self.mover.register(self.arena.buffer)
        self.pages = ArenaPages(self.arena, spec.landing_pages)  # which page is whose
        self._pools: dict[str, PoolHandle] = {}  # pool name -> handle (see add_pool)

    # -- identity -----------------------------------------------------------------------------
    def endpoint(self) -> Endpoint:
        return self.mover.endpoint()

    def introduce(self, endpoint: Endpoint) -> None:
        self.mover.introduce(endpoint)

    def add_pool(self, name: str, pool: PoolHandle) -> None:
        """Remember a pool's handle, so moves can name the pool instead of carrying its
        handle (pickling an actor handle costs ~0.4 ms per call)."""
        self._pools[name] = pool

    def _pool(self, pool: PoolHandle | str) -> PoolHandle:
        return self._pools[pool] if isinstance(pool, str) else pool

    def ping(self) -> str:
        return self.spec.name

    def stats(self) -> dict[str, Any]:
        s = self.arena.stats()
        return {"name": self.spec.name, **self.pages.counts(), "used_pages": s.used_pages,
                "capacity_bytes": self.spec.page_bytes * self.spec.num_pages,
                "used_bytes": s.used_bytes, "held_slots": self.mover.held_slots()}

    def keys(self) -> list[bytes]:
        return self.pages.keys()

    # -- page slots -------------------------------------------------------------------------
    def _span(self, page: int, length: int, expires: float = 0.0) -> RemoteSpan:
        """A peer may write the span (until ``expires``, the lease): the arena zeroes past
        what it turns out to hold."""
        self.arena.lend(page, length)
        return RemoteSpan(endpoint=self.mover.endpoint(), region=self._whole.pack(),
                          offset=self.arena.page_offset(page), length=length, expires=expires)

    @group(MOVE_OUT)
    def hold(self, key: bytes, expires: float, page: int, owner: str) -> bool:
        """``ArenaPages.hold``: a one-hop push into landing ``page`` went unanswered."""
        return self.pages.hold(key, expires, page, owner)

    def ingest(self, key: bytes, src: RemoteSpan) -> int:
        """Pull a page from a peer's staging (the API front) into a fresh arena page."""
        page = self.pages.alloc(key)
        with self.pages.writing(key, page, src.length, lent=0.0):  # a stalled pull may write
            self.arena.lend(page, src.length)
            self.mover.pull(src, self._whole, self.arena.page_offset(page))
        return src.length

    def span(self, key: bytes) -> RemoteSpan:
        """Where a resident page sits, for a peer's NIXL transfer (link checks)."""
        page = self.pages.page(key)
        return self._span(page, self.arena.length(page) or self.spec.page_bytes)

    def serve(self, keys: list[bytes], dsts: list[RemoteSpan]) -> int:
        """Push resident pages into a peer's spans (a load back to the engine front), all
        in flight at once; returns the bytes moved. Raises ``UnknownPageKey`` (nothing
        pushed) if a page is not resident."""
        if len(keys) != len(dsts):
            raise ValueError(f"{len(keys)} keys for {len(dsts)} spans")
        with self.pages.reading(keys) as pages:
            jobs: list[int] = []
            try:
                for page, dst in zip(pages, dsts):
                    jobs.append(self.mover.push_async(self._whole, self.arena.page_offset(page),
                                                      dst))
            except BaseException:
                self.mover.drain(jobs)  # the peer reuses its spans once we answer
                raise
            return self.mover.wait_all(jobs)

    @group(MOVE_OUT)
    def drop(self, key: bytes, scrub: bool = False) -> bool:
        """Free ``key``'s page; ``scrub`` zeroes it too (a restore into it failed part way,
        so it may still hold bytes of the page that had it before)."""
        return self.pages.release(key, scrub)

    @group(MOVE_OUT)
    def erase(self, keys: list[bytes]) -> int:
        """Tenant erasure: ``purge`` these pages; returns how many were held here."""
        return self.purge(keys).pages

    @group(MOVE_OUT)
    def purge(self, keys: list[bytes]) -> HbmPurged:
        """Tenant erasure: free and zero these pages (not just release them), zero every
        free page (pages dropped earlier, the tenant's among them, keep their bytes until
        reused) and every free staging slot (the last page encoded there). Landing pages an
        executor holds in stock are not touched here (a push may be on its way into one):
        the controller has its executor give them back, zeroed, right after this."""
        n, free = self.pages.purge(keys)
        return HbmPurged(pages=n, free_zeroed=free, staging_zeroed=self.mover.scrub_free())

    def arena_holds(self, needles: list[bytes]) -> list[bool]:
        """Test and audit helper: which of ``needles`` occur anywhere in the arena (every
        page, allocated, free or reserved). Copies the arena: never on the hot path."""
        whole = self.arena.buffer.cpu().numpy().tobytes()
        return [bytes(n) in whole for n in needles]

    @group(MOVE_OUT)
    def reset(self) -> int:
        """Drop every page and landing reservation (``ArenaPages.reset``: a new controller
        takes over this actor)."""
        return self.pages.reset()

    # -- landing pages (one-hop restores) -----------------------------------------------------
    def reserve(self, n: int, owner: str) -> list[tuple[int, tuple]]:
        """Set aside up to ``n`` free arena pages for ``owner`` (never more than
        ``spec.landing_pages`` at once), as ``(page, span wire)`` pairs. A pool may push a
        FULL page straight into one; ``land`` then names the key it holds. Only ``owner``
        can land or return them, so no other page is ever written through such a span.
        They are not zeroed here (that cost a page-sized memset per one-hop restore): the
        push overwrites the page up to its length, ``land`` zeroes past it, and a page
        given back is zeroed."""
        return [(page, self._span(page, self.spec.page_bytes).wire())
                for page in self.pages.reserve(n, owner)]

    def land(self, key: bytes, page: int, length: int, owner: str) -> None:
        """A reserved page now holds ``key`` (``length`` bytes, pushed by a pool)."""
        self.pages.land(key, page, length, owner)

    @group(MOVE_OUT)
    def release_landing(self, pages: list[int], owner: str) -> int:
        """Give reserved pages back (their owner no longer needs them), zeroed."""
        return self.pages.release_landing(pages, owner)

    def read(self, key: bytes) -> bytes:
        """Test and debug helper: the resident bytes (never on the hot path)."""
        return self.arena.read(self.pages.page(key))

    # -- tier moves ---------------------------------------------------------------------------
    @group(MOVE_OUT)
    def demote(self, meta: PageMeta, targets: list[tuple[int, int]], pool: PoolHandle | str,
               drop: bool = True) -> tuple:
        """Encode the page for each (tier, codec) target, let ``pool`` (a handle or the name
        of one given to ``add_pool``) pull and seal it. A page the lossy codec cannot
        encode (NaN/inf, or values beyond fp16 range) goes FULL instead: the receipt names
        the codec each copy has. Answers ``DemoteReceipt.wire()``."""
        handle = self._pool(pool)
        link = 0
        copies, sizes = [], []
        fell_back = False
        for tier, codec in targets:
            if fell_back:
                break  # a lossy target went FULL below: that copy holds all the rest would
            # Lent to the pool's answer; a pool that did not answer may still pull it.
            with self.mover.staged(1, lease_end(handle.timeout_s), held_on=unanswered) as st:
                with self.pages.reading([meta.key]) as (page,):
                    raw = self.arena.view(page)[: meta.length].numpy()
                    out = self.mover.slot_view(st.slots[0])
                    try:
                        n = encode_page(raw, meta.length, meta.shape, Codec(codec), out)
                    except CodecInputError:  # NaN/inf or beyond fp16: no lossy form
                        codec, fell_back = int(Codec.FULL), True
                        n = encode_page(raw, meta.length, meta.shape, Codec.FULL, out)
                receipt = handle.store_from(meta, Tier(tier), Codec(codec), st.span(0, n))
            link += n
            copies.append((int(receipt.tier), int(codec)))
            sizes.append(n)
        if drop:
            self.drop(meta.key)
        return DemoteReceipt(copies=tuple(copies), tier_bytes=tuple(sizes), link_bytes=link,
                             pool=handle.name).wire()

    def restore(self, meta: PageMeta, tier: int, codec: int, pool: PoolHandle | str
                ) -> tuple[int, int, int, bool]:
        """Have ``pool`` push the sealed-then-opened form into staging, decode into the
        arena. Answers ``RestoreReceipt.wire()``."""
        handle = self._pool(pool)
        if meta.length > self.spec.page_bytes:  # a push would run into the next arena page
            raise PageTooLarge(f"a {meta.length} B page does not fit {self.spec.page_bytes} B")
        page = self.pages.alloc(meta.key)
        expires = lease_end(handle.timeout_s)  # what the pool is lent lasts as we wait
        full = Codec(codec) is Codec.FULL
        with self.pages.writing(meta.key, page, meta.length, expires if full else None):
            if full:
                span = self._span(page, meta.length, expires)  # straight into the arena page
                got = handle.restore_to(meta.key, meta.digest, int(codec), span.wire())
            else:
                with self.mover.staged(1, expires, held_on=unanswered) as st:
                    span = st.span(0, self.mover.slot_bytes)
                    got = handle.restore_to(meta.key, meta.digest, int(codec), span.wire())
                    self.arena.lend(page, meta.length)
                    dst = self.arena.view(page)[: meta.length].numpy()
                    decode_into(self.mover.slot_view(st.slots[0], got.nbytes), meta.shape, dst)
        return RestoreReceipt(tier=int(got.tier), codec=int(codec), link_bytes=got.nbytes,
                              exact=full).wire()

    def close(self) -> None:
        self.mover.close()

