"""The store as a library: put / get / delete / contains by key over a host pool and an
NVMe shard, optionally sealed per tenant, without the cluster service.

    store = KVStore(KVStoreConfig(name="my-kv", slot_bytes=16 << 20, host_slots=64,
                                  nvme_dir="/mnt/nvme/kv"),
                    sealing=Sealing(keyring=memory_keyring("acme"), tenant="acme"))
    store.put(b"page-1", page_bytes)             # HOST; spills to NVMe when the pool is full
    store.get(b"page-1", out=buffer)             # straight into ``buffer``
    r = store.reserve(b"page-2", n)              # zero-copy producers: fill r.buffer...
    store.commit(r)                              # ...then publish (or store.abort(r))

Unsealed, a host value is written into its pool slot and read out of it on every core
(``store.parallel``), and ``reserve`` hands out the slot itself. Sealed (format 2 of
``security.chunked``), the page is sealed in chunks straight into the reserved slot or
the NVMe record buffer and opened straight into the caller's buffer; in the clear are
only the format version, a key id and the record's blinded slot identity (an HMAC of the
key under the tenant's blinding secret, also its NVMe key), and lengths are padded to
size classes. ``reserve`` then hands out a plaintext staging buffer that ``commit`` seals.
Sealing itself is ``store.kv_sealing`` (a sealed NVMe value is read and opened chunk by
chunk, overlapped). A sealed NVMe record that does not open (its key was erased) leaves the
shard at once, and on open every record that no longer opens is dropped.

One writer process per store (the host pool's and the shard's locks); the host index is
this process's, while NVMe records are found by key again after a restart.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np

from security.chunked import HEAD_BYTES, record_size
from security.errors import InvalidSeal
from store.buffers import aligned_buffer
from store.host_pool import HostPool, PoolError, PoolFull, SlotEmpty, TornRead
from store.kv_sealing import Sealing, TenantSeal
from store.nvme import NvmeShard, NvmeShardConfig
from store.nvme.files import check_key
from store.parallel import as_bytes, copy_into
from store.types import Lookup, Tier

__all__ = ["KVError", "KVStore", "KVStoreConfig", "KeyMissing", "NoRoom", "Reservation",
           "Sealing", "ValueTooLarge"]
_TORN_RETRIES = 3


class KVError(Exception):
    """Base class of library store failures."""


class KeyMissing(KVError, KeyError):
    """No readable value under that key (never stored, deleted, or failed to open)."""


class ValueTooLarge(KVError, ValueError):
    """The value is larger than ``slot_bytes``."""


class NoRoom(KVError):
    """Neither tier could take the value."""


@dataclass(frozen=True, kw_only=True)
class KVStoreConfig:
    name: str  # host pool segment in /dev/shm (unique per store)
    slot_bytes: int  # the largest value
    host_slots: int = 0  # 0: no host tier
    nvme_dir: str | None = None  # None: no NVMe tier
    nvme: NvmeShardConfig = field(default_factory=NvmeShardConfig)

    def __post_init__(self) -> None:
        if self.slot_bytes <= 0 or self.host_slots < 0:
            raise ValueError("slot_bytes must be positive and host_slots non-negative")
        if not self.host_slots and self.nvme_dir is None:
            raise ValueError("a store needs a host tier, an NVMe tier, or both")


@dataclass(slots=True)
class Reservation:
    key: bytes
    nbytes: int
    tier: Tier
    buffer: np.ndarray  # write the value here, then ``commit``
    slot: int = -1  # host slot, or -1 (NVMe, or an empty value)
    target: np.ndarray | None = None  # sealed: the reserved slot the record is sealed into


class KVStore:
    """A keyed store over a host pool and an NVMe shard (see the module doc)."""

    def __init__(self, config: KVStoreConfig, sealing: Sealing | None = None) -> None:
        self.config = config
        self.sealing = sealing
        self._seal = None if sealing is None else TenantSeal(sealing)
        self._lock = threading.RLock()
        self._host_index: dict[bytes, int] = {}
        stored = record_size(config.slot_bytes) if sealing else config.slot_bytes
        self.host = HostPool.create(config.name, stored, config.host_slots) \
            if config.host_slots else None
        try:
            self.nvme = None if config.nvme_dir is None else NvmeShard(config.nvme_dir, config.nvme)
        except BaseException:
            self._close_host(unlink=True)
            raise
        # Sealed NVMe records are built here, then written; sealed reads and staged
        # plaintext (sealed ``reserve``) use their own buffers.
        need = config.nvme_dir is not None or sealing is not None
        self._record = aligned_buffer(max(stored, 4096)) if need else None
        self._staging = aligned_buffer(config.slot_bytes) if sealing else None
        if sealing is not None and self.nvme is not None:
            # Records sealed under keys erased while the store was down never open again:
            # they leave the shard's index now instead of failing every read.
            self.nvme.prune(lambda nkey, head, n: self._seal.owns(nkey, head, n, self._record),
                            HEAD_BYTES)

    # -- writing --------------------------------------------------------------------------
    def put(self, key: bytes, value: Any, tier: Tier = Tier.HOST) -> Tier:
        """Store ``value`` under ``key`` (replacing any old value); returns the tier it went
        to (HOST spills to NVMe when the pool is full)."""
        src = as_bytes(memoryview(value).cast("B") if not isinstance(value, np.ndarray)
                       else value)
        with self._lock:
            reservation = self.reserve(key, src.shape[0], tier, _direct=True)
            try:
                if self.sealing is not None:
                    return self._commit(reservation, src)
                if reservation.tier is Tier.HOST:
                    copy_into(reservation.buffer, src)
                    return self._commit(reservation, None)
                self._forget(key)
                self.nvme.put(key, src, 0)  # straight from the caller's buffer
                return Tier.NVME
            except BaseException:
                self._abort(reservation)
                raise

    def reserve(self, key: bytes, nbytes: int, tier: Tier = Tier.HOST, *,
                _direct: bool = False) -> Reservation:
        """Room for an ``nbytes`` value under ``key``: fill ``buffer``, then ``commit`` (or
        ``abort``). Unsealed host values are written into the slot itself."""
        check_key(key)
        if nbytes > self.config.slot_bytes:
            raise ValueTooLarge(f"{nbytes} B exceed slot_bytes {self.config.slot_bytes}")
        with self._lock:
            if tier is Tier.HOST and self.host is not None and not nbytes and not self.sealing:
                return Reservation(key=key, nbytes=0, tier=Tier.HOST,
                                   buffer=np.empty(0, np.uint8))  # nothing to hold
            if tier is Tier.HOST and self.host is not None:
                try:
                    slot = self.host.alloc()
                except PoolFull:
                    slot = -1
                if slot >= 0:
                    view = self.host.reserve(slot, record_size(nbytes) if self.sealing
                                             else nbytes)
                    if self.sealing is None:
                        return Reservation(key=key, nbytes=nbytes, tier=Tier.HOST,
                                           buffer=view, slot=slot)
                    return Reservation(key=key, nbytes=nbytes, tier=Tier.HOST, slot=slot,
                                       buffer=self._plain_buffer(nbytes, _direct), target=view)
            if self.nvme is None:
                raise NoRoom(f"no free host slot for {key!r:.40} and no NVMe tier")
            buf = self._plain_buffer(nbytes, _direct) if self.sealing else self._record[:nbytes]
            return Reservation(key=key, nbytes=nbytes, tier=Tier.NVME, buffer=buf)

    def commit(self, reservation: Reservation) -> Tier:
        """Publish a reserved value; the old value of its key goes."""
        with self._lock:
            try:
                plain = reservation.buffer if self.sealing is not None else None
                return self._commit(reservation, plain)
            except BaseException:
                self._abort(reservation)
                raise

    def abort(self, reservation: Reservation) -> None:
        with self._lock:
            self._abort(reservation)

    def _plain_buffer(self, nbytes: int, direct: bool) -> np.ndarray:
        # put() seals straight from the caller's bytes; reserve() stages them first
        return np.empty(0, np.uint8) if direct else self._staging[:nbytes]

    def _commit(self, r: Reservation, plain: np.ndarray | None) -> Tier:
        self._forget(r.key)
        if r.tier is Tier.HOST:
            if plain is None:
                if r.slot >= 0:
                    self.host.commit(r.slot, r.nbytes)
            else:  # sealed in place, into the reserved slot
                size = self._seal.seal_into(r.target, plain, r.key, Tier.HOST)
                self.host.commit(r.slot, size)
            self._host_index[r.key] = r.slot
            return Tier.HOST
        if plain is None:
            self.nvme.put(r.key, self._record[:r.nbytes], 0)
        else:
            size = self._seal.seal_into(self._record, plain, r.key, Tier.NVME)
            self.nvme.put(self._seal.slot_id(r.key), self._record[:size], 0)
        return Tier.NVME

    def _abort(self, r: Reservation) -> None:
        if r.tier is Tier.HOST and r.slot >= 0 and self._host_index.get(r.key) != r.slot:
            with contextlib.suppress(PoolError):  # not reserved any more
                self.host.abort(r.slot)
            self.host.free(r.slot)

    # -- reading --------------------------------------------------------------------------
    def get(self, key: bytes, out: Any = None) -> memoryview | bytes:
        """The value under ``key``: into ``out`` (returns a view of it) or as bytes.
        Raises ``KeyMissing``."""
        check_key(key)
        with self._lock:
            slot = self._host_index.get(key)
            if slot is not None:
                return self._get_host(key, slot, out)
            if self.nvme is None:
                raise KeyMissing(key)
            return self._get_nvme(key, out)

    def _get_host(self, key: bytes, slot: int, out: Any) -> memoryview | bytes:
        if slot < 0:  # an empty value
            return b"" if out is None else memoryview(out).cast("B")[:0]
        if self.sealing is None:
            data = self.host.read(slot, out)
            return data if out is not None else bytes(data)
        for _ in range(_TORN_RETRIES):
            try:
                record, seq = self.host.view(slot)
            except (SlotEmpty, TornRead):
                raise KeyMissing(key) from None
            opened = self._open(key, Tier.HOST, record, out)
            if self.host.unchanged(slot, seq):
                return opened
        raise KeyMissing(key)

    def _get_nvme(self, key: bytes, out: Any) -> memoryview | bytes:
        if self.sealing is None:
            data = self.nvme.get(key, out)
            if data is Lookup.MISS:
                raise KeyMissing(key)
            return data
        nkey = self._seal.slot_id(key)
        try:
            opened = self._seal.open_from_nvme(self.nvme, key, nkey, self._record, out)
        except InvalidSeal:
            self.nvme.delete(nkey)  # sealed under an erased key (or not ours): never opens
            raise KeyMissing(key) from None
        if opened is Lookup.MISS:
            raise KeyMissing(key)
        return opened if out is not None else bytes(opened)

    def _open(self, key: bytes, tier: Tier, record: Any, out: Any) -> memoryview | bytes:
        try:
            opened = self._seal.open(key, tier, record, out)
        except InvalidSeal:
            raise KeyMissing(key) from None
        return opened if out is not None else bytes(opened)

    def contains(self, key: bytes) -> bool:
        check_key(key)
        with self._lock:
            if key in self._host_index:
                return True
            if self.nvme is None:
                return False
            nkey = key if self.sealing is None else self._seal.slot_id(key)
            return self.nvme.locate(nkey)[0] is Lookup.HIT

    def drop_cache(self, key: bytes) -> bool:
        """Drop ``key``'s NVMe record from the page cache (the next get reads the device);
        True if it has one."""
        check_key(key)
        with self._lock:
            if self.nvme is None:
                return False
            nkey = key if self.sealing is None else self._seal.slot_id(key)
            return self.nvme.drop_cache(nkey) is Lookup.HIT

    def delete(self, key: bytes) -> bool:
        """Drop ``key``'s value; True if there was one."""
        check_key(key)
        with self._lock:
            return self._forget(key)

    def _forget(self, key: bytes) -> bool:
        slot = self._host_index.pop(key, None)
        if slot is not None:
            if slot >= 0:
                self.host.free(slot)
            return True
        if self.nvme is None:
            return False
        nkey = key if self.sealing is None else self._seal.slot_id(key)
        return self.nvme.delete(nkey) is Lookup.HIT

    def close(self, unlink: bool = True) -> None:
        with self._lock:
            if self.nvme is not None:
                self.nvme.close()
            self._close_host(unlink)

    def _close_host(self, unlink: bool) -> None:
        if self.host is not None:
            self.host.close()
            if unlink:
                self.host.unlink()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
