"""How a keyed store (``store.kv``) opens its tiers: the host pool (replacing a segment a
crashed writer left behind), the NVMe shard with the records an open retires, and the
finalizer that removes the pool's /dev/shm segment when a store is dropped unclosed.

On open, every sealed record that no longer opens because the keyring records why (its
generation was erased, or the whole tenant was, ``erased_generations`` / ``erasures``)
or that is damaged is retired. An open that finds records not its own to retire fails
first, touching nothing (``store.kv_sealing.open_plan`` decides): ``SealingMismatch``
(written with sealing set the other way), ``ForeignTenant`` (another live tenant's) and
``ForeignKeyring`` (intact records that open under no key of the keyring, which records
no erasure of them: the same tenant name under another keyring's keys)."""

from __future__ import annotations

import weakref

import numpy as np

from store import forks, shm_segment
from store.host_pool import MAGIC as POOL_MAGIC
from store.host_pool import HostPool, PoolBusy
from store.kv_sealing import TenantSeal, open_plan, survey
from store.kv_types import KVStoreConfig
from store.nvme import NvmeShard

__all__ = ["create_host", "open_nvme", "unlink_when_dropped"]


def create_host(name: str, slot_bytes: int, slots: int) -> HostPool:
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


def open_nvme(config: KVStoreConfig, seal: TenantSeal | None, scratch: np.ndarray
              ) -> NvmeShard:
    """The store's shard, less the records sealed under keys erased while the store was
    down: they never open again, so they leave the index now instead of failing every read.
    What is not this store's to drop fails the open before anything goes (``open_plan``);
    the shard is closed again on any failure."""
    nvme = NvmeShard(config.nvme_dir, config.nvme)
    try:
        kinds = survey(nvme, seal, scratch)
        for nkey in open_plan(str(nvme.path), kinds, seal is not None):
            nvme.delete(nkey)
    except BaseException:
        nvme.close()
        raise
    return nvme


def unlink_when_dropped(store: object, host: HostPool) -> weakref.finalize:
    """Remove ``host``'s /dev/shm segment (which this process created) when ``store`` is
    garbage-collected or the interpreter exits without ``close()``: tmpfs pages outlive
    the process, so a store dropped unclosed leaked its whole pool. A fork child never
    removes its parent's segment; ``close`` detaches the finalizer."""
    opened = forks.generation()

    def unlink() -> None:  # holds the pool, never the store
        if not forks.forked_since(opened):
            host.unlink()  # this very file only, never a newer one of that name

    return weakref.finalize(store, unlink)
