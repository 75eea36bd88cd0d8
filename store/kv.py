"""The store as a library: put / get / delete / contains by key over a host pool and an
NVMe shard, optionally sealed per tenant, without the cluster service.

    store = KVStore(KVStoreConfig(name="my-kv", slot_bytes=16 << 20, host_slots=64,
                                  nvme_dir="/mnt/nvme/kv"),
                    sealing=Sealing(keyring=memory_keyring("acme"), tenant="acme"))
    store.put(b"page-1", page_bytes)             # HOST; spills to NVMe when the pool is full
    store.get(b"page-1", out=buffer)             # straight into ``buffer``
    with store.reserve(b"page-2", n) as r:       # zero-copy producers fill r.buffer: it is
        fill(r.buffer)                           # committed on exit, aborted on an error

Unsealed, a host value is written into its pool slot and read out of it on every core
(``store.parallel``), and ``reserve`` hands out the slot itself. Sealed (format 2 of
``security.chunked``), the page is sealed in chunks straight into the reserved slot or
the NVMe record buffer and opened straight into the caller's buffer; in the clear are
only the format version, a key id and the record's blinded slot identity (an HMAC of the
key under the tenant's blinding secret, also its NVMe key), and lengths are padded to
size classes. ``reserve`` then hands out a plaintext staging buffer that ``commit`` seals.
Sealing itself is ``store.kv_sealing``. A sealed NVMe record that does not open (its key
was erased) leaves the shard at once; what an open retires, or refuses with a typed error
and touches nothing: ``store.kv_open``.

One writer process per store (the host pool's and the shard's locks; a fork child gets
``StoreForked``); the host index is this process's, NVMe records are found by key again
after a restart (a pool segment a crashed writer left in /dev/shm is replaced; one of a
store dropped unclosed is removed). A key's old value goes only once its new one is in,
but in a host-only store with every slot taken ``put`` over a key on the host writes
into that key's own slot (``ReplaceFailed`` if that fails: the key is gone, never half a
value). Reservations: ``store.kv_reservations``. ``out`` buffers: ``BadOutBuffer``."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, NamedTuple, Self

import numpy as np

from security.chunked import record_size
from security.errors import InvalidSeal
from store import forks
from store.buffers import aligned_buffer
from store.host_pool import PoolError, PoolFull
from store.kv_open import create_host, open_nvme, unlink_when_dropped
from store.kv_reservations import Reservation, ReservationLedger, finished
from store.kv_sealing import Sealing, TenantSeal
from store.kv_types import (
    BadConfig,
    BadKey,
    BadOutBuffer,
    ForeignKeyring,
    ForeignTenant,
    KeyMissing,
    KVError,
    KVStoreConfig,
    NoRoom,
    ReplaceFailed,
    ReservationClosed,
    SealingMismatch,
    StoreClosed,
    StoreForked,
    ValueTooLarge,
    check_room,
    fit_out,
    key_arg,
    length_arg,
    no_room,
    out_arg,
    source_bytes,
    tier_arg,
)
from store.nvme import DiskFull, NvmeShard, NvmeShardConfig
from store.parallel import copy_into
from store.types import Lookup, Tier

__all__ = ["BadConfig", "BadKey", "BadOutBuffer", "ForeignKeyring", "ForeignTenant", "KVError",
           "KVStore", "KVStoreConfig", "KeyMissing", "NoRoom", "NvmeShardConfig", "ReplaceFailed",
           "Reservation", "ReservationClosed", "Sealing", "SealingMismatch", "StoreClosed",
           "StoreForked", "ValueTooLarge"]


class _Held(NamedTuple):
    """A value on the host: its slot (-1: an empty unsealed value) and its length."""

    slot: int
    nbytes: int


class KVStore:
    """A keyed store over a host pool and an NVMe shard (see the module doc)."""

    def __init__(self, config: KVStoreConfig, sealing: Sealing | None = None) -> None:
        self.config = config
        self.sealing = sealing
        self._seal = None if sealing is None else TenantSeal(sealing)
        if self._seal is not None:  # an unknown tenant fails here, before anything is made
            self._seal.slot_id(b"")
        stored = check_room(config, sealed=sealing is not None)  # sealed: a larger record
        self._lock = threading.RLock()
        self._closed = False
        self._pid, self._opened = os.getpid(), forks.generation()
        self._host_index: dict[bytes, _Held] = {}
        self.host = create_host(config.name, stored, config.host_slots) \
            if config.host_slots else None
        self._unlink = None if self.host is None else unlink_when_dropped(self, self.host)
        self.nvme: NvmeShard | None = None
        try:
            # Sealed NVMe records are built and read here; reservations stage in the spare.
            need = config.nvme_dir is not None or sealing is not None
            self._record = aligned_buffer(max(stored, 4096)) if need else None
            self._reservations = ReservationLedger(
                aligned_buffer(config.slot_bytes) if sealing else self._record)
            if config.nvme_dir is not None:  # less what no longer opens (``open_nvme``)
                self.nvme = open_nvme(config, self._seal, self._record)
        except BaseException:
            self._close_host(unlink=True)
            raise

    # -- writing --------------------------------------------------------------------------
    def put(self, key: bytes, value: Any, tier: Tier = Tier.HOST) -> Tier:
        """Store ``value`` under ``key`` (replacing any old value); returns the tier it went
        to (HOST spills to NVMe when the pool is full). In a host-only store with every slot
        taken, a key held on the host is replaced in its own slot: ``ReplaceFailed`` if that
        write fails (the key is then missing)."""
        src = source_bytes(value)
        with self._lock:
            reservation = self._reserve(key, src.shape[0], tier, direct=True)
            try:
                if self.sealing is not None:
                    return self._commit(reservation, src)
                if reservation.tier is Tier.HOST:
                    copy_into(reservation.buffer, src)
                    return self._commit(reservation, None)
                self._nvme_put(key, src)  # straight from the caller's buffer
                self._drop_host(key)
                return Tier.NVME
            except BaseException as exc:
                self._abort(reservation)
                if reservation.in_place and isinstance(exc, Exception):
                    raise ReplaceFailed(f"{key!r:.40}: replacing the value in its own host "
                                        f"slot failed, the old value is gone: {exc}") from exc
                raise

    def reserve(self, key: bytes, nbytes: int, tier: Tier = Tier.HOST) -> Reservation:
        """Room for an ``nbytes`` value under ``key``: fill ``buffer``, then ``commit`` or
        ``abort`` (or use it as a context manager); unsealed, the buffer is the slot."""
        with self._lock:
            r = self._reserve(key, nbytes, tier, direct=False)
            self._reservations.watch(r)  # dropped unfinished: given back at the next call
            return r

    def _reserve(self, key: bytes, nbytes: int, tier: Tier, *, direct: bool) -> Reservation:
        key_arg(key)
        nbytes, tier = length_arg(nbytes), tier_arg(tier)
        if nbytes > self.config.slot_bytes:
            raise ValueTooLarge(f"{nbytes} B exceed slot_bytes {self.config.slot_bytes}")
        self._ready()
        r = Reservation(key=key, nbytes=nbytes, tier=Tier.NVME, buffer=_EMPTY, owner=self)
        if tier is Tier.HOST and self.host is not None:
            r.tier = Tier.HOST
            if not nbytes and not self.sealing:
                return r  # nothing to hold
            self._host_slot(r, in_place=direct)
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
            raise self._no_room(key, tier, direct)
        if not direct:  # put() seals or writes straight from the caller's bytes
            self._reservations.lend(r)
        return r

    def _host_slot(self, r: Reservation, *, in_place: bool) -> None:
        """A free slot for ``r``; with none, and no NVMe tier to spill to, a ``put`` takes
        over its key's own slot (its old value goes now), else ``r`` goes to NVMe."""
        try:
            r.slot = self.host.alloc()
            return
        except PoolFull:
            held = self._host_index.get(r.key)
        if in_place and self.nvme is None and held is not None and held.slot >= 0:
            del self._host_index[r.key]  # gone from now: never read half-written
            r.slot, r.in_place = held.slot, True
        else:
            r.tier = Tier.NVME

    def _no_room(self, key: bytes, tier: Tier, direct: bool) -> NoRoom:
        return no_room(key, tier, self.config.host_slots,
                       tier is Tier.HOST and not direct and key in self._host_index)

    def commit(self, reservation: Reservation) -> Tier:
        """Publish a reserved value; the old value of its key goes. ``ReservationClosed``
        for a reservation committed or aborted before."""
        with self._lock:
            self._ready()
            with self._reservations.settled(reservation, self):  # then the staging is wiped
                try:
                    plain = reservation.buffer if self.sealing is not None else None
                    return self._commit(reservation, plain)
                except BaseException:
                    self._abort(reservation)
                    raise

    def abort(self, reservation: Reservation) -> None:
        """Give a reservation up (nothing is published); a finished one is left alone."""
        with self._lock:
            if finished(reservation) or self._closed:
                reservation.owner = None
                return
            with self._reservations.settled(reservation, self):
                self._abort(reservation)

    def _commit(self, r: Reservation, plain: np.ndarray | None) -> Tier:
        # the new value goes in first: a failure leaves the old one readable
        if r.tier is Tier.HOST:
            if plain is not None:  # sealed in place, into the reserved slot
                self.host.commit(r.slot, self._seal.seal_into(r.target, plain, r.key,
                                                              Tier.HOST))
            elif r.slot >= 0:
                self.host.commit(r.slot, r.nbytes)
            self._forget(r.key)
            self._host_index[r.key] = _Held(r.slot, r.nbytes)
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
        held = self._host_index.get(r.key)
        if r.tier is Tier.HOST and r.slot >= 0 and (held is None or held.slot != r.slot):
            self._give_back(r.slot)

    def _give_back(self, slot: int) -> None:
        with contextlib.suppress(PoolError):  # not reserved any more
            self.host.abort(slot)
        self.host.free(slot)

    # -- reading --------------------------------------------------------------------------
    def get(self, key: bytes, out: Any = None) -> memoryview | bytes:
        """The value under ``key``: into ``out`` (returns a view of it) or as bytes.
        Raises ``KeyMissing``; ``BadOutBuffer`` for an ``out`` that cannot take it."""
        key_arg(key)
        flat = None if out is None else out_arg(out)
        with self._lock:
            self._ready()
            held = self._host_index.get(key)
            if held is not None:
                return self._get_host(key, held, flat)
            if self.nvme is None:
                raise KeyMissing(key)
            return self._get_nvme(key, flat)

    def _get_host(self, key: bytes, held: _Held, flat: np.ndarray | None
                  ) -> memoryview | bytes:
        dst = None if flat is None else fit_out(flat, held.nbytes)
        if held.slot < 0:  # an empty value
            return b"" if dst is None else memoryview(dst)
        if self.sealing is None:
            return self.host.read(held.slot, dst)
        try:
            opened = self._seal.open_from_host(self.host, held.slot, key, dst)
        except InvalidSeal:  # sealed under an erased key: never opens, so it goes (as on NVMe)
            self._drop_host(key)
            raise KeyMissing(key) from None
        if opened is Lookup.MISS:
            raise KeyMissing(key)
        return opened if dst is not None else bytes(opened)

    def _get_nvme(self, key: bytes, flat: np.ndarray | None) -> memoryview | bytes:
        if self.sealing is None:
            found, loc = self.nvme.locate(key)
            if found is Lookup.MISS:
                raise KeyMissing(key)
            data = self.nvme.get(key, None if flat is None else fit_out(flat, loc.length))
            if data is Lookup.MISS:
                raise KeyMissing(key)
            return data
        opened = self._seal.open_from_nvme(self.nvme, key, self._record, flat)
        if opened is Lookup.MISS:
            raise KeyMissing(key)
        return opened if flat is not None else bytes(opened)

    def contains(self, key: bytes) -> bool:
        """Whether ``get`` would find ``key``: a sealed host value that no longer opens (its
        key was erased) goes, as ``get`` drops it; an NVMe record is not opened (a read)."""
        key_arg(key)
        with self._lock:
            self._ready()
            held = self._host_index.get(key)
            if held is not None:
                if self.sealing is None or held.slot < 0 or \
                        self._seal.host_opens(self.host, held.slot):
                    return True
                self._drop_host(key)
                return False
            nkey = None if self.nvme is None else self._nvme_key(key)
            return nkey is not None and self.nvme.locate(nkey)[0] is Lookup.HIT

    def _nvme_key(self, key: bytes) -> bytes | None:
        """``key``'s key in the shard; None once the tenant was erased (``nvme_key``)."""
        return key if self.sealing is None else self._seal.nvme_key(key, self.nvme)

    def drop_cache(self, key: bytes) -> bool:
        """Drop ``key``'s NVMe record from the page cache (the next get reads the device);
        True if it has one."""
        key_arg(key)
        with self._lock:
            self._ready()
            nkey = None if self.nvme is None else self._nvme_key(key)
            return nkey is not None and self.nvme.drop_cache(nkey) is Lookup.HIT

    def delete(self, key: bytes) -> bool:
        """Drop ``key``'s value; True if there was one."""
        key_arg(key)
        with self._lock:
            self._ready()
            return self._forget(key)

    def _forget(self, key: bytes) -> bool:
        if self._drop_host(key):
            return True
        nkey = None if self.nvme is None else self._nvme_key(key)
        if nkey is None:
            return False
        try:
            return self.nvme.delete(nkey) is Lookup.HIT
        except DiskFull as exc:  # no room for its tombstone: it stays, readable
            raise NoRoom(f"{key!r:.40}: no room on NVMe to record its deletion: {exc}") from exc

    def _drop_host(self, key: bytes) -> bool:
        held = self._host_index.pop(key, None)
        if held is None:
            return False
        if held.slot >= 0:
            self.host.free(held.slot)
        return True

    def close(self, unlink: bool = True) -> None:
        """Close both tiers (again: a no-op); every later call raises ``StoreClosed``. In a
        fork child it only marks the store closed: the tiers' locks and files are the
        parent's (unlocking the pool would drop the parent's writer lock)."""
        with self._lock:
            if forks.forked_since(self._opened):
                self._closed = True
                return
            if not self._closed:
                self._closed = True
                self._host_index.clear()
                self._reservations.clear()
                if self.nvme is not None:
                    self.nvme.close()
            self._close_host(unlink)

    def _close_host(self, unlink: bool) -> None:
        if self.host is not None:
            self._unlink.detach()  # closed: ``unlink`` decides
            self.host.close()
            if unlink:
                self.host.unlink()

    def _ready(self) -> None:
        """Every call starts here (under the lock): closed is ``StoreClosed``; slots that
        reservations dropped unfinished come back."""
        if self._closed:
            raise StoreClosed(f"store {self.config.name} is closed")
        if forks.forked_since(self._opened):
            raise StoreForked(f"store {self.config.name} is process {self._pid}'s: a fork child "
                              f"opens a store of its own")
        for slot in self._reservations.dropped():
            self._give_back(slot)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_EMPTY = np.empty(0, np.uint8)

