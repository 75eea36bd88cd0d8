"""A pool whose NVMe tier is full (real NIXL, /dev/shm, AES-GCM and NVMe shard; the actors
in this process): a store the shard cannot take lands in a free host slot; with no free slot
either it is refused with ``NvmeTierFull``, which names the NVMe tier; nothing the pool
already held is lost, and the pool counts both outcomes in its stats. The shard is full by
its quota (``pool.nvme_bytes``: ``QuotaFull``) or, where this process may mount one, by a
real tmpfs file system with no space left (``DiskFull``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.mover import Mover
from agentkv_cluster.runtime.pool_actor import NvmeTierFull
from agentkv_cluster.runtime.pool_geometry import nvme_record_bytes, smallest_slot_bytes
from agentkv_cluster.runtime.records import PageMeta, PoolReceipt
from agentkv_cluster.runtime.tenants import ensure_tenant
from store.types import Codec, Tier
from tests.support.tmpfs import fill, tmpfs

pytestmark = pytest.mark.integration
PAGE = 64 << 10
ONE_RECORD = nvme_record_bytes(PAGE)  # an NVMe quota that holds exactly one page


@contextlib.contextmanager
def _pool(workdir: Path, *, host_slots: int, nvme_bytes: int, nvme_dir: Path | None = None,
          slot_bytes: int = PAGE) -> Iterator[tuple]:
    """(pool handle, front mover with one page slot): one pool of ``host_slots`` slots over
    an NVMe shard with quota ``nvme_bytes`` in ``nvme_dir``."""
    cfg = load_config(env={}, overrides={
        "hbm": {"page_bytes": PAGE, "num_pages": 2},
        "pool": {"pool_bytes": host_slots * slot_bytes, "slot_bytes": slot_bytes,
                 "nvme_bytes": nvme_bytes, "nvme_dir": str(nvme_dir or workdir / "nv")},
        "security": {"tenant_keys_dir": str(workdir / "keys")}})
    topo = wiring.deploy_local(cfg, workdir)
    ensure_tenant(str(workdir / "keys"), "acme")
    front = Mover(f"test-front-{id(topo):x}", PAGE, 1)
    wiring.introduce(topo.pools["node0"], front)
    try:
        yield topo.pools["node0"], front
    finally:
        wiring.shutdown(topo)
        front.close()


def _store(pool, front, name: bytes, tier: Tier) -> tuple[PoolReceipt, bytes]:
    """Page ``name`` (PAGE bytes of its first byte's value) stored on ``tier``."""
    meta = PageMeta(key=name * 32, digest=b"d" * 32, tenant="acme", namespace="acme",
                    session="s", page_id=0, state_type=StateType.EVIDENCE, length=PAGE,
                    tokens=1)
    front.slot_view(0, PAGE)[:] = np.full(PAGE, name[0], dtype=np.uint8)
    return pool.store_from(meta, tier, Codec.FULL, front.slot_span(0, PAGE)), name * PAGE


def _read(pool, front, name: bytes) -> tuple[Tier, bytes]:
    """Where page ``name`` was restored from, and its bytes."""
    front.slot_view(0, PAGE)[:] = 0
    receipt = pool.restore_to(name * 32, b"d" * 32, int(Codec.FULL),
                              front.slot_span(0, PAGE).wire())
    return receipt.tier, front.slot_view(0, PAGE).tobytes()


def test_a_store_the_full_nvme_tier_cannot_take_lands_in_a_free_host_slot(tmp_path) -> None:
    with _pool(tmp_path, host_slots=2, nvme_bytes=ONE_RECORD) as (pool, front):
        first, a = _store(pool, front, b"a", Tier.NVME)
        second, b = _store(pool, front, b"b", Tier.NVME)  # the quota holds one page
        assert (first.tier, second.tier) == (Tier.NVME, Tier.HOST)
        assert (_read(pool, front, b"a"), _read(pool, front, b"b")) == \
            ((Tier.NVME, a), (Tier.HOST, b))
        stats = pool.stats()
        assert (stats["nvme_full"], stats["refused_full"]) == (1, 0)


def test_a_store_with_both_tiers_full_is_refused_and_every_copy_stays(tmp_path) -> None:
    with _pool(tmp_path, host_slots=1, nvme_bytes=ONE_RECORD) as (pool, front):
        _, a = _store(pool, front, b"a", Tier.NVME)
        _, b = _store(pool, front, b"b", Tier.HOST)
        with pytest.raises(NvmeTierFull, match="NVMe tier of pool node0 is full"):
            _store(pool, front, b"c", Tier.HOST)  # no free slot to spill from, nor to
        with pytest.raises(NvmeTierFull):
            _store(pool, front, b"d", Tier.NVME)
        assert pool.holds_many([b"c" * 32, b"d" * 32]) == [None, None]
        assert (_read(pool, front, b"a"), _read(pool, front, b"b")) == \
            ((Tier.NVME, a), (Tier.HOST, b))
        assert (pool.stats()["nvme_full"], pool.stats()["refused_full"]) == (2, 2)
        # Room again (a page retired): the pool takes pages as before.
        assert pool.delete(b"b" * 32, "acme") == 1
        receipt, c = _store(pool, front, b"c", Tier.HOST)
        assert receipt.tier is Tier.HOST and _read(pool, front, b"c") == (Tier.HOST, c)


def test_a_page_stored_again_on_a_full_tier_keeps_its_copy(tmp_path) -> None:
    """Pages are immutable: a store of a copy the pool holds already, refused for a full
    tier, is answered by that copy."""
    with _pool(tmp_path, host_slots=1, nvme_bytes=ONE_RECORD) as (pool, front):
        _, a = _store(pool, front, b"a", Tier.NVME)
        _store(pool, front, b"b", Tier.HOST)
        assert _store(pool, front, b"a", Tier.NVME)[0].tier is Tier.NVME
        assert _read(pool, front, b"a") == (Tier.NVME, a)


def test_a_slot_of_the_smallest_size_the_config_allows_holds_a_full_page(tmp_path) -> None:
    slot = smallest_slot_bytes(PAGE)
    assert slot < PAGE  # the page's size class leaves room: the rule refuses no more
    with _pool(tmp_path, host_slots=1, nvme_bytes=ONE_RECORD,
               slot_bytes=slot) as (pool, front):
        _, a = _store(pool, front, b"a", Tier.HOST)
        _, b = _store(pool, front, b"b", Tier.NVME)
        assert (_read(pool, front, b"a"), _read(pool, front, b"b")) == \
            ((Tier.HOST, a), (Tier.NVME, b))


def test_a_full_file_system_refuses_honestly_and_loses_nothing(tmp_path) -> None:
    with tmpfs(tmp_path / "fs", 1 << 20) as fs, \
            _pool(tmp_path, host_slots=2, nvme_bytes=1 << 30, nvme_dir=fs) as (pool, front):
        _, a = _store(pool, front, b"a", Tier.NVME)
        fill(fs)
        # Stored again while the disk is full: the old record is retired (its tombstone
        # draws on the shard's space reserve) and the new host copy takes its place.
        assert _store(pool, front, b"a", Tier.HOST)[0].tier is Tier.HOST
        # The shard compacts the retired record away: room for one more on the full disk.
        receipt, b = _store(pool, front, b"b", Tier.NVME)
        assert receipt.tier is Tier.NVME
        receipt, c = _store(pool, front, b"c", Tier.NVME)  # to the last free host slot instead
        assert receipt.tier is Tier.HOST
        with pytest.raises(NvmeTierFull, match="file system"):
            _store(pool, front, b"d", Tier.HOST)
        assert [_read(pool, front, n) for n in (b"a", b"b", b"c")] == [
            (Tier.HOST, a), (Tier.NVME, b), (Tier.HOST, c)]
        assert pool.stats()["refused_full"] == 1
