"""Where the engine adapter puts page bytes: a small protocol and two backends.

The adapter only needs put/get/delete by opaque key. `HostPoolPageStore` maps keys
to slots of the shared-memory host pool (STORE-A) in this process;
`ServicePageStore` sends pages to the AgentKV service through its Python client.
"""

from __future__ import annotations

import mmap
from typing import Any, Protocol

import numpy as np

from agentkv_cluster.api.protocol import PageLostError, RemoteError
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.host_pool import HostPool, PoolFull, SlotEmpty, TornRead
from store.host_pool import PageTooLarge as SlotTooSmall
from store.types import Lookup


class PageStoreError(Exception):
    """Base class for page-store failures."""


class PageTooLarge(PageStoreError, ValueError):
    """A page's bytes do not fit one slot of the backing pool."""


class PageStoreFull(PageStoreError):
    """No free slot is left in the backing pool."""


class PageStoreClosed(PageStoreError):
    """The store was closed; it holds no pages and takes none."""


class OneFormPerPage(PageStoreError, ValueError):
    """The backing store keeps one form of each page; another form was sent."""


class PageStore(Protocol):
    """Byte storage for KV pages, keyed by opaque bytes."""

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity) -> None:
        """Keep ``data`` under ``key``; ``identity`` is for stores that index or seal by it."""

    def get(self, key: bytes) -> tuple[Lookup, bytes | memoryview | None]:
        """The page's bytes; a view may be reused by the next ``get`` (copy what you keep)."""

    def delete(self, key: bytes) -> None:
        """Forget ``key``; its bytes are overwritten before the space holds another page."""

    def __contains__(self, key: bytes) -> bool: ...


class HostPoolPageStore:
    """Pages in a `HostPool` (shared memory, readable from other processes).

    `delete` zeroes the slot before it goes back to the pool (and the read buffer, if it
    holds that page): a process that maps the segment never sees a deleted page's KV.
    """

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._slots: dict[bytes, tuple[int, int]] = {}  # key -> (slot, length)
        # Reads land in one reused, page-aligned buffer: fresh memory costs ~0.7 GB/s
        # of first-touch faults here, a warm buffer runs at memcpy speed.
        self._scratch = np.frombuffer(mmap.mmap(-1, pool.slot_bytes), dtype=np.uint8)
        self._scratch[:] = 0  # fault the pages in once, now
        self._scratch_key: bytes | None = None  # whose bytes the read buffer holds
        self._closed = False

    @classmethod
    def create(cls, name: str, slot_bytes: int, num_slots: int) -> HostPoolPageStore:
        return cls(HostPool.create(name, slot_bytes, num_slots))

    @property
    def pool(self) -> HostPool:
        return self._pool

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity | None = None
            ) -> None:
        self._check_open()
        if key in self._slots:
            return  # same key = same identity, tokens and codec: the bytes are identical
        try:
            slot = self._pool.alloc()
        except PoolFull as exc:
            raise PageStoreFull(f"host pool is full ({len(self._slots)} pages)") from exc
        try:
            self._pool.write(slot, data)
        except SlotTooSmall as exc:
            self._pool.free(slot)
            raise PageTooLarge(f"page of {len(data)} B does not fit a slot: {exc}") from exc
        self._slots[key] = (slot, len(data))

    def get(self, key: bytes) -> tuple[Lookup, bytes | memoryview | None]:
        self._check_open()
        entry = self._slots.get(key)
        if entry is None:
            return Lookup.MISS, None
        self._scratch_key = key
        try:
            data = self._pool.read(entry[0], out=self._scratch)
        except (SlotEmpty, TornRead):
            return Lookup.MISS, None
        return Lookup.HIT, data

    def delete(self, key: bytes) -> None:
        self._check_open()
        entry = self._slots.pop(key, None)
        if entry is None:
            return
        self._pool.free(entry[0], scrub=True)  # zeroed before the slot can be reused
        if self._scratch_key == key:
            self._scratch[: entry[1]] = 0
            self._scratch_key = None

    def __contains__(self, key: bytes) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def close(self, unlink: bool = True) -> None:
        """Unmap the pool (and remove it, with ``unlink``); later calls raise
        `PageStoreClosed`. Closing twice is not an error."""
        if self._closed:
            return
        self._closed = True
        self._slots.clear()
        self._pool.close()
        if unlink:
            self._pool.unlink()

    def _check_open(self) -> None:
        if self._closed:
            raise PageStoreClosed(f"page store over {self._pool.name} is closed")


class ServicePageStore:
    """Pages in the AgentKV service, for one session (`SessionClient` of api/client.py).

    `store_pages` after a model call, `load` (prepare + complete) on restore,
    `release` at task end. The service keys pages by their blinded identity and
    chooses tier and form itself, so it keeps one form per identity: a second form of a
    page raises `OneFormPerPage` (store full precision only). A page the service no
    longer holds (evicted, retired) is a miss and is forgotten, so the next store sends
    it again.
    """

    def __init__(self, session: Any, state_type: str = "temp_reasoning") -> None:
        self._session = session
        self._state_type = state_type
        self._keys: dict[bytes, tuple[bytes, bytes]] = {}  # key -> (service key, identity)
        self._forms: dict[bytes, bytes] = {}  # packed identity -> the adapter key holding it

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity) -> None:
        if key in self._keys:
            return
        if identity is None:
            raise ValueError("the service indexes pages by identity; none was given")
        packed = identity.pack()
        if self._forms.get(packed, key) != key:
            raise OneFormPerPage(
                f"the service already holds page [{identity.start}, {identity.end}) of session "
                f"{identity.session!r} in another form; it keeps one form per page (store "
                "with specs=(CodecSpec.full(),))")
        page = {"identity": packed, "data": bytes(data),
                "page_id": int.from_bytes(key[:7], "big"), "state_type": self._state_type}
        self._keys[key] = (self._session.store_pages([page])[0], packed)
        self._forms[packed] = key

    def get(self, key: bytes) -> tuple[Lookup, bytes | None]:
        entry = self._keys.get(key)
        if entry is None:
            return Lookup.MISS, None
        try:
            return Lookup.HIT, self._session.load([entry[0]])[0]
        except RemoteError as exc:
            if not isinstance(exc, PageLostError) and exc.code != "not_found":
                raise
            # evicted, retired, or lost by the service (its only copy died with an HBM
            # actor): the adapter recomputes, then re-stores
            self._forget(key)
            return Lookup.MISS, None

    def delete(self, key: bytes) -> None:
        service_key = self._forget(key)
        if service_key is None:
            return
        try:
            self._session.release([service_key])
        except RemoteError as exc:
            if exc.code != "not_found":  # already retired (e.g. by TASK_END) is fine
                raise

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def _forget(self, key: bytes) -> bytes | None:
        """Drop ``key`` from both maps; its service key, if it had one."""
        entry = self._keys.pop(key, None)
        if entry is None:
            return None
        del self._forms[entry[1]]
        return entry[0]
