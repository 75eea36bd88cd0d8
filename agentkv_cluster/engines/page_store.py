"""Where the engine adapter puts page bytes: a small protocol and a host-pool backend.

The adapter only needs put/get/delete by opaque key; the host pool (shared memory
over /dev/shm, STORE-A) provides slots, this module maps keys to slots.
"""

from __future__ import annotations

import mmap
from typing import Protocol

import numpy as np

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


class PageStore(Protocol):
    """Byte storage for KV pages, keyed by opaque bytes."""

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity) -> None:
        """Keep ``data`` under ``key``; ``identity`` is for stores that index or seal by it."""

    def get(self, key: bytes) -> tuple[Lookup, bytes | memoryview | None]:
        """The page's bytes; a view may be reused by the next ``get`` (copy what you keep)."""

    def delete(self, key: bytes) -> None: ...

    def __contains__(self, key: bytes) -> bool: ...


class HostPoolPageStore:
    """Pages in a `HostPool` (shared memory, readable from other processes)."""

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._slots: dict[bytes, tuple[int, int]] = {}  # key -> (slot, length)
        # Reads land in one reused, page-aligned buffer: fresh memory costs ~0.7 GB/s
        # of first-touch faults here, a warm buffer runs at memcpy speed.
        self._scratch = np.frombuffer(mmap.mmap(-1, pool.slot_bytes), dtype=np.uint8)
        self._scratch[:] = 0  # fault the pages in once, now

    @classmethod
    def create(cls, name: str, slot_bytes: int, num_slots: int) -> HostPoolPageStore:
        return cls(HostPool.create(name, slot_bytes, num_slots))

    @property
    def pool(self) -> HostPool:
        return self._pool

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity | None = None
            ) -> None:
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
        entry = self._slots.get(key)
        if entry is None:
            return Lookup.MISS, None
        try:
            data = self._pool.read(entry[0], out=self._scratch)
        except (SlotEmpty, TornRead):
            return Lookup.MISS, None
        return Lookup.HIT, data

    def delete(self, key: bytes) -> None:
        entry = self._slots.pop(key, None)
        if entry is not None:
            self._pool.free(entry[0])

    def __contains__(self, key: bytes) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def close(self, unlink: bool = True) -> None:
        self._slots.clear()
        self._pool.close()
        if unlink:
            self._pool.unlink()
