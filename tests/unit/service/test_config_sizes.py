"""The size rules between settings: a pool slot and the NVMe quota must hold one FULL page of
``hbm.page_bytes``, or the config is refused at load time, naming the setting and the
smallest value that works; a combination that works is accepted, even a slot below the page
(its sealed record fits: size classes leave room)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from agentkv_cluster.config import ConfigError, load_config
from agentkv_cluster.config_sizes import size_conflicts
from agentkv_cluster.runtime import pool_geometry
from security.record_layout import record_size
from store.host_pool import HostPool
from store.nvme import NvmeShard, NvmeShardConfig, QuotaFull

KIB, MIB = 1 << 10, 1 << 20


def _load(page: int, **pool: int):
    return load_config(env={}, overrides={"hbm": {"page_bytes": page}, "pool": pool})


@pytest.mark.parametrize(("page", "smallest"), [
    (64 * KIB, 56 * KIB + 1), (128 * KIB, 112 * KIB + 1), (MIB, 896 * KIB + 1),
    (4 * MIB, 3584 * KIB + 1), (5 * MIB, 4 * MIB + 1)])
def test_a_slot_that_cannot_hold_a_full_page_is_refused_naming_the_smallest(
        page: int, smallest: int) -> None:
    assert pool_geometry.smallest_slot_bytes(page) == smallest
    assert _load(page, slot_bytes=smallest).pool.slot_bytes == smallest
    with pytest.raises(ConfigError) as info:
        _load(page, slot_bytes=smallest - 1)
    assert info.value.field == "pool.slot_bytes"
    assert f"at least {smallest} B" in str(info.value) and str(page) in str(info.value)


def test_a_slot_that_holds_only_a_compressed_page_is_refused() -> None:
    """Half a page holds its INT8 form, not its FULL one: refused (LRU, opaque pages, risk
    references, write-through and most pressure demotions store pages FULL)."""
    with pytest.raises(ConfigError) as info:
        _load(128 * KIB, slot_bytes=64 * KIB + 4 * KIB)
    assert info.value.field == "pool.slot_bytes"


def test_the_default_sizes_and_a_slot_of_one_page_are_accepted() -> None:
    assert size_conflicts(load_config(env={})) == []
    for page in (4 * KIB, 100_000, 32 * MIB):
        assert size_conflicts(_load(page, slot_bytes=page, pool_bytes=64 * MIB,
                                    nvme_bytes=64 * MIB)) == []


@pytest.mark.parametrize("page", [64 * KIB, 4 * MIB])
def test_an_nvme_quota_below_one_page_record_is_refused_naming_the_smallest(page: int) -> None:
    need = pool_geometry.nvme_record_bytes(page)
    assert _load(page, slot_bytes=page, nvme_bytes=need).pool.nvme_bytes == need
    with pytest.raises(ConfigError) as info:
        _load(page, slot_bytes=page, nvme_bytes=need - 1)
    assert info.value.field == "pool.nvme_bytes"
    assert f"at least {need} B" in str(info.value)
    cfg = _load(page, slot_bytes=page)
    short = dataclasses.replace(cfg, pool=dataclasses.replace(cfg.pool, nvme_bytes=need - 1))
    (conflict,) = size_conflicts(short)
    assert (conflict.field, conflict.bound) == ("pool.nvme_bytes", need)


def test_the_nvme_bound_is_what_a_shard_takes_for_one_page_record(tmp_path) -> None:
    page = 64 * KIB
    record = memoryview(bytearray(record_size(page)))  # a sealed FULL page, as a store writes
    key = b"k" * pool_geometry.NVME_KEY_BYTES
    need = pool_geometry.nvme_record_bytes(page)
    with NvmeShard(tmp_path / "fits", NvmeShardConfig(max_bytes=need)) as shard:
        shard.put(key, record, 0)
    with NvmeShard(tmp_path / "short", NvmeShardConfig(max_bytes=need - 1)) as shard, \
            pytest.raises(QuotaFull):
        shard.put(key, record, 0)


def test_the_slot_bound_is_what_a_host_slot_holds() -> None:
    page = 128 * KIB
    slot = pool_geometry.smallest_slot_bytes(page)
    assert pool_geometry.host_slot_bytes(slot) >= record_size(page)
    assert pool_geometry.host_slot_bytes(slot - 1) < record_size(page)
    assert pool_geometry.staging_slot_bytes(slot) >= page
    pool = HostPool.create(f"akv-sizes-{uuid.uuid4().hex[:10]}",
                           pool_geometry.host_slot_bytes(slot), 1)
    try:
        view = pool.reserve(pool.alloc(), record_size(page))  # raises if the record did not fit
        assert len(view) == record_size(page)
    finally:
        pool.close()
        pool.unlink()
