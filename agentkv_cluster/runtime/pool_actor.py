"""Cluster memory-pool actor: one per node, fronting that node's host pool and NVMe shard.

Pages arrive in their codec's form (the HBM actor compresses), are sealed with the tenant's key
on the way in, opened on the way out, and every copy is published in the directory. A restarted
actor rebuilds its index from the records' sealed meta blocks (``pool_records``) and refills an
emptied directory (``republish``); generations come back from the records, never lowered.
"""

from __future__ import annotations

import secrets
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.runtime.erasure_receipts import PoolPurged
from agentkv_cluster.runtime.mover import Endpoint, Mover, RemoteSpan, stalled
from agentkv_cluster.runtime.pool_geometry import host_slot_bytes, staging_slot_bytes
from agentkv_cluster.runtime.pool_publisher import PoolPublisher
from agentkv_cluster.runtime.pool_records import (
    ChunkOpener,
    RecordBuffers,
    RecordSealer,
    SealRejected,
    StoredCopy,
    holding_of,
    read_entry,
)
from agentkv_cluster.runtime.pool_tiers import (
    NvmeTierFull,
    StoresInFlight,
    TierWriter,
    open_host,
)
from agentkv_cluster.runtime.records import PageMeta, PoolReceipt
from security.blinding import DirectoryBlinder, size_bucket
from security.chunked import ChunkedSealer
from security.errors import KeyUnavailable
from security.keyring import FileKeySource, TenantKeyring
from security.sealing import TenantSealer
from store.directory import DirectoryEntry
from store.host_pool import SlotEmpty, TornRead
from store.nvme import FsyncPolicy, NvmeShard, NvmeShardConfig
from store.types import Codec, Lookup, Tier

# Host copies are opened straight from shared memory; a write racing the open (the slot freed
# and reused) makes the restore start over, this many times at most.
_TORN_RETRIES = 3


class PageMissing(Exception):
    """The pool holds no readable copy of that page in that form."""


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    name: str  # unique per node; also the directory's ``node``
    host_slot_bytes: int
    host_slots: int
    nvme_dir: str
    nvme_bytes: int
    keys_dir: str
    shm_name: str  # host-pool segment; a restarted actor re-attaches to it
    staging_slots: int = 4
    nvme_fsync: bool = False  # every NVMe record synced (else at segment close)
    nvme_reserve_tombstones: int = 32  # store.nvme.NvmeShardConfig.reserve_tombstones


class PoolActor:
    """Seals, stores, opens and serves pages of every tenant on one node."""

    def __init__(self, spec: PoolSpec, directory: Any) -> None:
        self.spec = spec
        self.name = spec.name
        self.directory = directory
        self.publisher = PoolPublisher(directory)  # its writes, never under the lock
        self.keyring = TenantKeyring(FileKeySource(spec.keys_dir))
        self.sealer = TenantSealer(self.keyring)
        self.blinder = DirectoryBlinder(self.keyring)
        self.mover = Mover(f"pool-{spec.name}-{secrets.token_hex(3)}",
                           staging_slot_bytes(spec.host_slot_bytes), spec.staging_slots)
        self.host = open_host(spec.shm_name, host_slot_bytes(spec.host_slot_bytes),
                              spec.host_slots)
        self.buffers = RecordBuffers(self.host.slot_bytes)  # NVMe records, both ways
        self.chunked = ChunkedSealer(self.keyring)
        self.records = RecordSealer(self.chunked, self.buffers)
        self.nvme = NvmeShard(spec.nvme_dir, NvmeShardConfig(
            max_bytes=spec.nvme_bytes, reserve_tombstones=spec.nvme_reserve_tombstones,
            fsync=FsyncPolicy.EVERY_RECORD if spec.nvme_fsync else FsyncPolicy.ON_CLOSE))
        self._index: dict[tuple[bytes, Codec], StoredCopy] = {}
        self._lock = threading.RLock()
        self.tiers = TierWriter(self.host, self.nvme, self._lock, spec.name)
        self.storing = StoresInFlight(self._lock)
        self.opener = ChunkOpener(self.sealer, self.chunked, self.mover, spec.name)
        self.torn = 0  # restores that found their host copy rewritten mid-read and retried
        self._rebuild()
        self.publisher.start(self.republish)  # republishes after failed or lost writes

    # -- start-up and recovery ---------------------------------------------------------------
    def _rebuild(self) -> None:
        """Index every record found on the host segment and the NVMe shard. A slot a store
        allocated and never committed (the old actor died) holds nothing: it is freed."""
        for slot, _version, _length in list(self.host.slots(empty=True)):
            self.host.free(slot)
        for slot, _version, _length in list(self.host.slots()):
            try:
                entry = read_entry(self.chunked, self.host.read(slot), Tier.HOST, slot)
            except (SlotEmpty, TornRead, ValueError):
                self.host.free(slot)
                continue
            self._adopt(*entry)
        for nkey in list(self.nvme.keys()):  # a snapshot: bad records leave the index
            data = self.nvme.get(nkey)
            if data is Lookup.MISS:
                continue
            try:
                entry = read_entry(self.chunked, data, Tier.NVME, -1)
            except ValueError:  # an erased tenant's record (key shredded) or not a record:
                self.nvme.delete(nkey)  # it can never be served, so it leaves the shard
                continue
            self._adopt(*entry)

    def _adopt(self, key: bytes, codec: Codec, copy: StoredCopy) -> None:
        if (key, codec) in self._index:  # the old actor died between a re-store's write and
            self.tiers.discard(copy)  # its old copy's release: one copy (pages never change)
            return
        self._index[(key, codec)] = copy
        with suppress(KeyUnavailable):  # a legacy record of an erased tenant: no namespace
            self.publisher.saw(self.blinder.namespace(copy.namespace), copy.dir_gen)

    def republish(self) -> int:
        """Re-insert every local copy into the directory (the head's watch, the publisher's
        repair loop); none of a tenant erased meanwhile by another process (keys gone)."""
        token, entries = self.publisher.republishing(), {}  # a write failing from here: stale
        with self._lock:
            held = list(self._index.items())
        live = {t for t in {c.namespace for _, c in held} if self.keyring.has_keys(t)}
        for (key, codec), copy in [(h, c) for h, c in held if c.namespace in live]:
            with suppress(KeyUnavailable):  # a legacy record of an erased tenant (``_adopt``)
                entry = self._entry(key, codec, copy)
                entries[(entry.tenant_ns, key)] = entry
        self.publisher.restore(list(entries.values()))
        with self._lock:  # deleted meanwhile: an entry must not outlive its copies
            gone = [(ns, k) for ns, k in entries if all((k, c) not in self._index for c in Codec)]
        for ns, key in gone:
            self.publisher.delete(ns, key)
        self.publisher.republished(token)
        return len(entries) - len(gone)

    # -- identity -------------------------------------------------------------------------------
    def endpoint(self) -> Endpoint:
        return self.mover.endpoint()

    def introduce(self, endpoint: Endpoint) -> None:
        self.mover.introduce(endpoint)

    def ping(self) -> str:
        return self.name

    def stats(self) -> dict[str, Any]:
        host = self.host.stats()
        nv = self.nvme.stats()
        return {"name": self.name, "copies": len(self._index), "host_used_bytes": host.used_bytes,
                "nvme_live_bytes": nv.live_bytes, "rejects": self.opener.rejects,
                "torn": self.torn, "nvme_full": self.tiers.counts.nvme_full,
                "refused_full": self.tiers.counts.refused_full,
                "nvme_reserve_bytes": nv.reserve_bytes,
                "nvme_reserve_target_bytes": nv.reserve_target_bytes}

    def holds_many(self, keys: list[bytes]) -> list[tuple | None]:
        """What this pool keeps of each page (None: nothing), as ``PoolHolding.wire()``."""
        out: list[tuple | None] = []
        with self._lock:
            for key in keys:
                found = [(c, x) for c in Codec if (x := self._index.get((key, c))) is not None]
                out.append(None if not found else holding_of(found).wire())
        return out

    def _entry(self, key: bytes, codec: Codec, copy: StoredCopy) -> DirectoryEntry:
        return DirectoryEntry(
            key=key, tenant_ns=self.blinder.namespace(copy.namespace), tier=copy.tier,
            node=self.name, location=f"{copy.tier.name.lower()}:{copy.loc}", codec=codec,
            size_bucket=size_bucket(copy.nbytes), generation=copy.dir_gen)

    # -- data path ------------------------------------------------------------------------------
    def store_from(self, meta: PageMeta, tier: Tier, codec: Codec, src: RemoteSpan
                   ) -> tuple[int, int]:
        """Pull an encoded page from ``src``, seal it, store it on ``tier`` or, when that one
        is full, the other (``pool_tiers``); ``NvmeTierFull`` when neither has room."""
        with self.mover.staged(1, 0.0, held_on=stalled) as st:  # a stalled pull may write
            slot = st.slots[0]
            self.mover.pull(src, self.mover.staging_region, slot * self.mover.slot_bytes)
            return self._store(meta, tier, codec, self.mover.slot_view(slot, src.length)).wire()

    def _store(self, meta: PageMeta, tier: Tier, codec: Codec, plain: Any) -> PoolReceipt:
        """Seal ``plain`` into a new copy of the page. Only the index and the slot bookkeeping
        run under the pool's lock: the directory round trips and the sealing run outside
        it, so stores of different pages (a load's victims, gap migrations, other HBM
        actors') overlap instead of queueing behind one another. Stores of one page in one
        form still run one at a time, and a restore of that copy waits for its store."""
        ns_dir = self.blinder.namespace(meta.namespace)
        shape = meta.shape
        # Random, not a counter: a tenant reading its own locations must not learn how many
        # pages other tenants stored in between (loc * 4096 + chunk must fit 64 bits).
        copy = StoredCopy(tier=Tier.NVME, slot=-1, loc=secrets.randbits(52),
                          dir_gen=self.publisher.generation(ns_dir), nbytes=len(plain),
                          seal_gen=self.keyring.current_generation(meta.namespace),
                          namespace=meta.namespace, full=meta.length,
                          state_type=meta.state_type.value,
                          shape=None if shape is None else shape.stored(),
                          structured=meta.structured)
        storing = self.storing.begin(meta.key, codec, meta.namespace)
        sealed = (meta.key, codec, copy, meta.digest, plain)
        try:
            self.tiers.write(tier, copy, lambda: self.records.into_slot(self.host, *sealed),
                             lambda: self.records.to_nvme(self.nvme, *sealed))
        except BaseException as exc:  # nothing written; an older copy of the page stays
            with self._lock:
                self.storing.end(meta.key, codec)
                held = self._index.get((meta.key, codec))
            if isinstance(exc, NvmeTierFull) and held is not None:  # it holds the page already
                return PoolReceipt(tier=held.tier, nbytes=held.nbytes)
            raise
        with self._lock:
            self.storing.end(meta.key, codec)
            held = self._index.get((meta.key, codec))  # replaced only now, if at all
            if storing.cancelled:  # deleted or erased while it was sealed: keep nothing
                self.tiers.discard(copy, scrub=True)
            elif held is None or self.tiers.replaced(held, copy):
                self._index[(meta.key, codec)] = copy
            else:  # the old copy could not be retired (a full disk): it stays, the new goes
                return PoolReceipt(tier=held.tier, nbytes=held.nbytes)
        if storing.cancelled:
            plain[:] = 0  # the staging slot held its plaintext (zeroed outside the lock)
            raise PageMissing("the page was deleted or its tenant erased while stored")
        self.publisher.put(self._entry(meta.key, codec, copy))
        with self._lock:  # deleted between its commit and its entry: drop the entry again
            deleted = (meta.key, codec) not in self._index
        if deleted:
            self.publisher.delete(ns_dir, meta.key)
        return PoolReceipt(tier=copy.tier, nbytes=len(plain))

    def restore_to(self, key: bytes, digest: bytes, codec: int, dst: tuple) -> tuple[int, int]:
        """Open the (key, codec) copy, on whichever tier holds it, and push its plaintext into
        ``dst`` (``RemoteSpan.wire()``). Plain values: Ray passes those without pickling."""
        want, span = Codec(codec), RemoteSpan.from_wire(dst)
        slot = self.mover.take_slot()
        try:
            for _ in range(_TORN_RETRIES):
                with self._lock:
                    self.storing.wait(key, want)  # being stored again: read the new one
                    copy = self._index.get((key, want))
                    if copy is None:
                        raise PageMissing(f"no {want.name} copy of that page in {self.name}")
                    if copy.tier is Tier.HOST:
                        try:
                            record, seq = self.host.view(copy.slot)
                        except (SlotEmpty, TornRead):
                            raise PageMissing("host copy vanished") from None
                # Opened outside the lock, so restores do not queue behind one another or behind
                # stores: a host copy is read in place (a store that frees and reuses its slot
                # moves the slot's seqlock), an NVMe copy into a buffer of this restore's own.
                if copy.tier is Tier.HOST:
                    done = self.opener.open_and_push(
                        digest, copy, record, slot, span,
                        lambda s=copy.slot, q=seq: self.host.unchanged(s, q))
                else:
                    done = self._restore_nvme(key, want, digest, copy, slot, span)
                if done:
                    return PoolReceipt(tier=copy.tier, nbytes=copy.nbytes).wire()
                with self._lock:
                    self.torn += 1
            raise PageMissing("the copy kept changing while it was read")
        finally:
            self.mover.give_slot(slot)

    def _restore_nvme(self, key: bytes, codec: Codec, digest: bytes, copy: StoredCopy,
                      slot: int, span: RemoteSpan) -> bool:
        """Read ``copy`` from the shard, open it into staging ``slot`` and push it to ``span``;
        False (nothing pushed) when the copy was dropped or replaced meanwhile."""
        def current() -> bool:  # a store of it in flight may have written its new record
            return self._index.get((key, codec)) is copy and not self.storing.busy(key, codec)

        with self.buffers.take() as buf:
            data = self.nvme.get(copy.nkey, out=buf)
            if data is Lookup.MISS:
                with self._lock:
                    if not current():
                        return False
                    del self._index[(key, codec)]
                raise PageMissing("NVMe copy failed its checksum")
            return self.opener.open_and_push(digest, copy, data, slot, span, current)

    def probe_link(self, dst: RemoteSpan) -> int:
        """Raw NIXL push of ``dst.length`` staging bytes (link check, benchmark baseline)."""
        slot = self.mover.take_slot()
        try:
            return self.mover.push(self.mover.staging_region, slot * self.mover.slot_bytes, dst)
        finally:
            self.mover.give_slot(slot)

    def delete_copy(self, key: bytes, codec: Codec) -> bool:
        """Drop the page's copy in ``codec`` (a store of it in flight keeps nothing)."""
        with self._lock:
            self.storing.cancel(key, codec)
            copy = self._index.pop((key, codec), None)
            if copy is not None:
                self.tiers.discard(copy)
            return copy is not None

    def delete(self, key: bytes, namespace: str) -> int:
        """Drop every copy of a page and its directory entry; returns copies removed."""
        with self._lock:
            gone = sum(self.delete_copy(key, c) for c in Codec)
        with suppress(KeyUnavailable):  # an erased tenant's legacy copy has no entry
            if gone:
                self.publisher.delete(self.blinder.namespace(namespace), key)
        return gone

    def _erase_copies(self, tenant: str, tier: Tier, generation: int | None
                      ) -> list[tuple[bytes, Codec]]:
        """Drop and scrub every copy of ``tenant``'s own pages held in ``tier`` (with
        ``generation``: those sealed under it); returns them. See ``purge_tenant``."""
        with self._lock:
            if generation is None:  # stores in flight keep nothing (of a generation: they
                self.storing.cancel_namespace(tenant)  # seal under the current one)
            doomed = [(k, codec) for (k, codec), c in self._index.items()
                      if c.namespace == tenant and c.tier is tier
                      and generation in (None, c.seal_gen)]
            for key, codec in doomed:
                self._shred_copy(key, codec)
            return doomed

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        """Tenant erasure on this node: forget the tenant's cached keys (a tenant created again
        gets new ones), overwrite and drop every copy of its pages (host slots and NVMe payloads
        zeroed in place), then zero every free host slot, dead NVMe record (dropped copies keep
        their sealed bytes until reused) and free staging slot. Returns the counts per tier
        and the copies erased (the caller removes the directory entries: by then the blinded
        namespace can no longer be derived here). With ``generation`` (erased by another
        process: ``agentkv tenant erase --generation``): only that generation's cached keys
        and the copies sealed under it (overwritten; nothing else is zeroed: what it left
        elsewhere is sealed under the lost key); pages left with no copy leave the
        directory here (the caller tells the controller which copies went)."""
        if generation is None:
            self.keyring.forget(tenant)
            self.blinder.forget(tenant)
        else:  # a store sealing under it from now on fails: its key file is gone
            self.keyring.forget_generation(tenant, generation)
        self.chunked.forget(tenant, generation)
        with self._lock:
            host = self._erase_copies(tenant, Tier.HOST, generation)
            nvme = self._erase_copies(tenant, Tier.NVME, generation)
            keys = sorted({k for k, _ in host + nvme})
            bare = [k for k in keys if all((k, c) not in self._index for c in Codec)]
            whole = generation is None  # what a generation left is sealed under a lost key
            purged = PoolPurged(copies=tuple((k, int(c)) for k, c in host + nvme),
                                host=len(host), nvme=len(nvme),
                                host_free_zeroed=self.host.scrub_free() if whole else 0,
                                nvme_dead_zeroed=self.nvme.shred_dead() if whole else 0,
                                staging_zeroed=self.mover.scrub_free() if whole else 0)
        if generation is not None:  # the directory, never under the lock (none left
            with suppress(KeyUnavailable):  # when the whole tenant was erased meanwhile)
                namespace = self.blinder.namespace(tenant)
                for key in bare:
                    self.publisher.delete(namespace, key)
        return purged

    def tenants_held(self) -> list[str]:
        """The namespaces this pool holds copies of (recovered records included)."""
        with self._lock:
            return sorted({c.namespace for c in self._index.values()})

    def _shred_copy(self, key: bytes, codec: Codec) -> bool:
        """``delete_copy`` that overwrites the bytes, not only releases them (erasure)."""
        copy = self._index.pop((key, codec), None)
        if copy is not None:
            self.tiers.discard(copy, scrub=True)
        return copy is not None

    def reset(self) -> int:
        """Drop every copy (a new controller takes over; directory entries go with them)."""
        with self._lock:
            keys = {(k, c.namespace) for (k, _), c in self._index.items()}
            return sum(self.delete(k, ns) for k, ns in keys)

    def close(self, unlink: bool = True) -> None:
        self.publisher.close()
        self.opener.close()
        self.nvme.close()
        self.host.close()
        if unlink:
            self.host.unlink()
        self.mover.close()


__all__ = ["NvmeTierFull", "PageMissing", "PoolActor", "PoolSpec", "SealRejected"]
