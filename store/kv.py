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
shard at once, and on open every record that no longer opens is dropped (a record that
opens for another tenant of the keyring fails the open instead: ``ForeignTenant``).

One writer process per store (the host pool's and the shard's locks); the host index is
this process's, while NVMe records are found by key again after a restart (a pool segment
a crashed writer left in /dev/shm is replaced). A key's old value goes only once its new
one is in. A reservation is committed or aborted once (a second commit is
``ReservationClosed``), and reservations in flight never share a staging buffer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Self

import numpy as np

from security.chunked import HEAD_BYTES, record_size
from security.errors import InvalidSeal
from store import shm_segment
from store.buffers import aligned_buffer
from store.host_pool import MAGIC as POOL_MAGIC
from store.host_pool import HostPool, PoolBusy, PoolError, PoolFull, SlotEmpty, TornRead
from store.kv_sealing import Sealing, TenantSeal
from store.kv_types import (
    ForeignTenant,
    KeyMissing,
    KVError,
    KVStoreConfig,
    NoRoom,
    Reservation,
    ReservationClosed,
    StoreClosed,
    ValueTooLarge,
    length_arg,
    source_bytes,
    tier_arg,
)
from store.nvme import DiskFull, NvmeShard, NvmeShardConfig
from store.nvme.files import check_key
from store.parallel import copy_into
from store.types import Lookup, Tier

__all__ = ["ForeignTenant", "KVError", "KVStore", "KVStoreConfig", "KeyMissing", "NoRoom",
           "NvmeShardConfig", "Reservation", "ReservationClosed", "Sealing", "StoreClosed",
           "ValueTooLarge"]
_TORN_RETRIES = 3


class KVStore:
    """A keyed store over a host pool and an NVMe shard (see the module doc)."""

    def __init__(self, config: KVStoreConfig, sealing: Sealing | None = None) -> None:
        self.config = config
        self.sealing = sealing
        self._seal = None if sealing is None else TenantSeal(sealing)
        if self._seal is not None:  # an unknown tenant fails here, before prune() would
            self._seal.slot_id(b"")  # retire every record in the shard as not its own
        self._lock = threading.RLock()
        self._closed = False
        self._host_index: dict[bytes, int] = {}
        stored = record_size(config.slot_bytes) if sealing else config.slot_bytes
        self.host = _create_host(config.name, stored, config.host_slots) \
            if config.host_slots else None
        self.nvme: NvmeShard | None = None
        try:
            self.nvme = None if config.nvme_dir is None else NvmeShard(config.nvme_dir, config.nvme)
            # Sealed NVMe records are built and read here; reservations stage in the spare.
            need = config.nvme_dir is not None or sealing is not None
            self._record = aligned_buffer(max(stored, 4096)) if need else None
            self._staging = aligned_buffer(config.slot_bytes) if sealing else None
            self._spare = self._staging if sealing else self._record
            self._spare_lent = False
            if sealing is not None and self.nvme is not None:
                # Records sealed under keys erased while the store was down never open
                # again: they leave the shard's index now instead of failing every read.
                self.nvme.prune(lambda k, head, n: self._seal.owns(k, head, n, self._record),
                                HEAD_BYTES)
        except BaseException:
            if self.nvme is not None:
                self.nvme.close()
            self._close_host(unlink=True)
            raise

    # -- writing --------------------------------------------------------------------------
    def put(self, key: bytes, value: Any, tier: Tier = Tier.HOST) -> Tier:
        """Store ``value`` under ``key`` (replacing any old value); returns the tier it went
        to (HOST spills to NVMe when the pool is full)."""
        src = source_bytes(value)
        with self._lock:
            reservation = self.reserve(key, src.shape[0], tier, _direct=True)
            try:
                if self.sealing is not None:
                    return self._commit(reservation, src)
                if reservation.tier is Tier.HOST:
                    copy_into(reservation.buffer, src)
                    return self._commit(reservation, None)
                self._nvme_put(key, src)  # straight from the caller's buffer
                self._drop_host(key)
                return Tier.NVME
            except BaseException:
                self._abort(reservation)
                raise

    def reserve(self, key: bytes, nbytes: int, tier: Tier = Tier.HOST, *,
                _direct: bool = False) -> Reservation:
        """Room for an ``nbytes`` value under ``key``: fill ``buffer``, then ``commit`` (or
        ``abort``). Unsealed host values are written into the slot itself."""
        check_key(key)
        nbytes, tier = length_arg(nbytes), tier_arg(tier)
        if nbytes > self.config.slot_bytes:
            raise ValueTooLarge(f"{nbytes} B exceed slot_bytes {self.config.slot_bytes}")
        with self._lock:
            self._check_open()
            r = Reservation(key=key, nbytes=nbytes, tier=Tier.NVME, buffer=_EMPTY, owner=self)
            if tier is Tier.HOST and self.host is not None:
                r.tier = Tier.HOST
                if not nbytes and not self.sealing:
                    return r  # nothing to hold
                try:
                    r.slot = self.host.alloc()
                except PoolFull:
                    r.tier = Tier.NVME
            if r.tier is Tier.HOST:
                try:
                    view = self.host.reserve(r.slot, record_size(nbytes) if self.sealing
                                             else nbytes)
                except BaseException:
                    self.host.free(r.slot)
                    raise
                if self.sealing is None:
                    r.buffer = view
                    return r
                r.target = view
            elif self.nvme is None:
                raise NoRoom(f"no free host slot for {key!r:.40} and no NVMe tier")
            if not _direct:  # put() seals or writes straight from the caller's bytes
                self._lend(r)
            return r

    def commit(self, reservation: Reservation) -> Tier:
        """Publish a reserved value; the old value of its key goes. ``ReservationClosed``
        for a reservation committed or aborted before."""
        with self._lock:
            self._check_open()
            self._settle(reservation)
            try:
                plain = reservation.buffer if self.sealing is not None else None
                return self._commit(reservation, plain)
            except BaseException:
                self._abort(reservation)
                raise

    def abort(self, reservation: Reservation) -> None:
        """Give a reservation up (nothing is published); a finished one is left alone."""
        with self._lock:
            if reservation.owner is None or self._closed:
                reservation.owner = None
                return
            self._settle(reservation)
            self._abort(reservation)

    def _lend(self, r: Reservation) -> None:
        # One reservation at a time stages in the spare buffer; another one in flight gets
        # its own, so neither overwrites the other's bytes.
        if self._spare_lent:
            r.buffer = aligned_buffer(r.nbytes)
        else:
            r.buffer, r.lent, self._spare_lent = self._spare[:r.nbytes], True, True

    def _settle(self, r: Reservation) -> None:
        if r.owner is not self:
            raise ReservationClosed(f"{r.key!r:.40}: committed or aborted already"
                                    if r.owner is None else "another store's reservation")
        r.owner = None
        if r.lent:
            self._spare_lent = r.lent = False

    def _commit(self, r: Reservation, plain: np.ndarray | None) -> Tier:
        # the new value goes in first: a failure leaves the old one readable
        if r.tier is Tier.HOST:
            if plain is not None:  # sealed in place, into the reserved slot
                self.host.commit(r.slot, self._seal.seal_into(r.target, plain, r.key,
                                                              Tier.HOST))
            elif r.slot >= 0:
                self.host.commit(r.slot, r.nbytes)
            self._forget(r.key)
            self._host_index[r.key] = r.slot
            return Tier.HOST
        if plain is None:
            self._nvme_put(r.key, r.buffer)
        else:
            size = self._seal.seal_into(self._record, plain, r.key, Tier.NVME)
            self._nvme_put(self._seal.slot_id(r.key), self._record[:size])
        self._drop_host(r.key)
        return Tier.NVME

    def _nvme_put(self, nkey: bytes, data: np.ndarray) -> None:
        try:
            self.nvme.put(nkey, data, 0)
        except DiskFull as exc:
            raise NoRoom(f"the NVMe tier cannot take {data.shape[0]} B: {exc}") from exc

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
            self._check_open()
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
            self._check_open()
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
            self._check_open()
            if self.nvme is None:
                return False
            nkey = key if self.sealing is None else self._seal.slot_id(key)
            return self.nvme.drop_cache(nkey) is Lookup.HIT

    def delete(self, key: bytes) -> bool:
        """Drop ``key``'s value; True if there was one."""
        check_key(key)
        with self._lock:
            self._check_open()
            return self._forget(key)

    def _forget(self, key: bytes) -> bool:
        if self._drop_host(key):
            return True
        if self.nvme is None:
            return False
        nkey = key if self.sealing is None else self._seal.slot_id(key)
        return self.nvme.delete(nkey) is Lookup.HIT

    def _drop_host(self, key: bytes) -> bool:
        slot = self._host_index.pop(key, None)
        if slot is None:
            return False
        if slot >= 0:
            self.host.free(slot)
        return True

    def close(self, unlink: bool = True) -> None:
        """Close both tiers (again: a no-op); every later call raises ``StoreClosed``."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._host_index.clear()
                if self.nvme is not None:
                    self.nvme.close()
            self._close_host(unlink)

    def _close_host(self, unlink: bool) -> None:
        if self.host is not None:
            self.host.close()
            if unlink:
                self.host.unlink()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"store {self.config.name} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_EMPTY = np.empty(0, np.uint8)


def _create_host(name: str, slot_bytes: int, slots: int) -> HostPool:
    """A new host pool; a segment of that name that a crashed writer left behind (no live
    process holds its writer lock) is replaced, one a live store holds is ``PoolBusy``."""
    try:
        return HostPool.create(name, slot_bytes, slots)
    except FileExistsError:
        try:
            shm_segment.remove_abandoned(name, POOL_MAGIC)
        except shm_segment.SegmentBusy as exc:
            raise PoolBusy(f"host pool {name} is in use by a live store: {exc}") from exc
        return HostPool.create(name, slot_bytes, slots)
