"""Where a pool's new copy lands, and what a full tier does to it.

A store asks for a tier. HOST: a free host-pool slot, else the NVMe shard (a spill). NVME:
the shard, else a free host slot. A shard that is full (``store.nvme.DiskFull``: its file
system has no room, or no inode for its next segment file, ``SegmentNotCreated``, or its
quota ``pool.nvme_bytes`` none left after compacting retired records, ``QuotaFull``) has
written nothing; with no free host slot either, the store is refused with ``NvmeTierFull``.
Every copy the pool already holds stays: ``PoolActor`` replaces a page's old copy only once
the new one is written (and keeps the old one when the NVMe tier has no room left to retire
it: a full file system once the shard's space reserve for tombstones is spent), and a store
refused for a full tier is answered with the old copy when the pool holds the page in that
form already (pages are immutable).
``TierCounts`` counts stores that found the NVMe tier full, and those refused for it;
``StoresInFlight`` keeps each store between its start and its commit; ``open_host`` opens
the node's host segment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from agentkv_cluster.runtime.pool_records import StoredCopy
from store.host_pool import PAGE_BYTES, HostPool, PoolFull
from store.nvme import DiskFull, NvmeShard
from store.types import Tier

log = logging.getLogger(__name__)


def open_host(name: str, slot_bytes: int, slots: int) -> HostPool:
    """The node's host segment: created, or taken over after the pool actor died (it
    outlives the actor, so the new one finds the old one's pages). One of another geometry
    (``pool.slot_bytes`` or ``pool.pool_bytes`` changed meanwhile) is replaced: taken over,
    its smaller slots failed every full-size store on the node until removed by hand, and
    its size was not the one configured."""
    try:
        return HostPool.create(name, slot_bytes, slots)
    except FileExistsError:
        pool = HostPool.attach(name, writer=True)
    if pool.num_slots == slots and slot_bytes <= pool.slot_bytes < slot_bytes + PAGE_BYTES:
        return pool
    log.warning("host pool %s: the segment left by the last actor has %d slots of %d B, "
                "the configuration %d of %d B: replaced (its pages are recomputed)",
                name, pool.num_slots, pool.slot_bytes, slots, slot_bytes)
    pool.unlink()
    pool.close()
    return HostPool.create(name, slot_bytes, slots)


@dataclass(slots=True)
class Storing:
    """A store between its start and its commit: a delete or an erasure of its page meanwhile
    cancels it (the copy is scrubbed instead of kept)."""

    namespace: str
    cancelled: bool = False


class StoresInFlight:
    """The pool's stores in flight, by (key, codec), under the pool's lock: a second store of
    the same copy, or a restore of it, waits until the one in flight committed (the old copy
    stays until then); ``cancel`` makes one keep nothing."""

    def __init__(self, lock: threading.RLock) -> None:
        self._storing: dict[tuple[bytes, int], Storing] = {}
        self._stored = threading.Condition(lock)  # a store of some page committed

    def begin(self, key: bytes, codec: int, namespace: str) -> Storing:
        """Wait for a store of the same copy in flight, then mark this one in flight."""
        with self._stored:
            self.wait(key, codec)
            storing = self._storing[(key, codec)] = Storing(namespace)
            return storing

    def wait(self, key: bytes, codec: int) -> None:
        """Until no store of (key, codec) is in flight (the lock held)."""
        while (key, codec) in self._storing:
            self._stored.wait()

    def busy(self, key: bytes, codec: int) -> bool:
        """Whether a store of (key, codec) is in flight: an NVMe read of its copy may meet
        the record that store wrote under the same key before it committed."""
        return (key, codec) in self._storing

    def end(self, key: bytes, codec: int) -> None:  # under the lock
        del self._storing[(key, codec)]
        self._stored.notify_all()

    def cancel(self, key: bytes, codec: int) -> None:
        if (storing := self._storing.get((key, codec))) is not None:
            storing.cancelled = True

    def cancel_namespace(self, namespace: str) -> None:
        for storing in self._storing.values():
            storing.cancelled |= storing.namespace == namespace


class NvmeTierFull(Exception):
    """A store found the pool's NVMe tier full (its file system, or ``pool.nvme_bytes``)
    and no free host-pool slot to take the copy instead: nothing was written, and every
    copy the pool already held stays."""


@dataclass(slots=True)
class TierCounts:
    """Stores that found the NVMe tier full (``nvme_full``: placed in a host slot instead,
    or refused) and, of those, the ones refused with ``NvmeTierFull`` (``refused_full``)."""

    nvme_full: int = 0
    refused_full: int = 0


Seal = Callable[[], None]  # seals the copy where ``copy.tier`` / ``copy.slot`` say


class TierWriter:
    """Puts a new copy on the tier a store asks for, or the other one when that is full.
    Host slots are taken and given back under the pool's ``lock``; the sealing and the NVMe
    write (the caller's ``Seal`` functions) run outside it."""

    def __init__(self, host: HostPool, nvme: NvmeShard, lock: threading.RLock,
                 name: str) -> None:
        self.host, self.nvme = host, nvme
        self.lock = lock
        self.name = name
        self.counts = TierCounts()

    def write(self, tier: Tier, copy: StoredCopy, into_slot: Seal, to_nvme: Seal) -> None:
        """Seal ``copy`` on ``tier`` (``into_slot`` into ``copy.slot`` of the host pool,
        ``to_nvme`` onto the shard), or on the other tier when that one is full;
        ``copy.tier`` and ``copy.slot`` say where it went. Raises ``NvmeTierFull`` when
        neither has room (nothing written), or what sealing raised (nothing kept)."""
        if tier is Tier.HOST and self._into_host(copy, into_slot):
            return
        copy.tier, copy.slot = Tier.NVME, -1
        try:
            to_nvme()
            return
        except DiskFull as full:
            with self.lock:
                self.counts.nvme_full += 1
            if self._into_host(copy, into_slot):  # a slot may have been freed since
                return
            with self.lock:
                self.counts.refused_full += 1
            raise NvmeTierFull(f"the NVMe tier of pool {self.name} is full ({full}) and its "
                               "host pool has no free slot: nothing was stored") from None

    def _into_host(self, copy: StoredCopy, into_slot: Seal) -> bool:
        """Seal into a free host slot; False (nothing written) when none is free."""
        with self.lock:
            try:
                slot = self.host.alloc()
            except PoolFull:
                return False
        copy.tier, copy.slot = Tier.HOST, slot
        try:
            into_slot()
        except BaseException:
            with self.lock:
                self.host.free(slot)
            raise
        return True

    def discard(self, copy: StoredCopy, scrub: bool = False) -> None:
        """Release a copy's bytes (``scrub``: overwrite them too). Under the lock."""
        if copy.tier is Tier.HOST:
            self.host.free(copy.slot, scrub=scrub)
        elif scrub:
            self.nvme.shred(copy.nkey)
        else:
            self.nvme.delete(copy.nkey)

    def replaced(self, old: StoredCopy, new: StoredCopy) -> bool:
        """``new`` is to take ``old``'s place: release ``old``'s bytes (unless ``new`` is the
        NVMe record that superseded it under the same key) and answer True; or, when the
        NVMe tier has no room for the tombstone that retires ``old``'s record (a full file
        system, its space reserve spent), release ``new`` instead and answer False: ``old`` stays. Under the lock."""
        if old.tier is Tier.NVME and new.tier is Tier.NVME and old.nkey == new.nkey:
            return True
        try:
            self.discard(old)
        except DiskFull:
            with self.lock:
                self.counts.nvme_full += 1
            with suppress(DiskFull):  # a host slot frees without I/O
                self.discard(new)
            return False
        return True


__all__ = ["NvmeTierFull", "TierCounts", "TierWriter"]
