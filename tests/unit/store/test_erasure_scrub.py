"""Erasure scrubbing in the byte stores: free host-pool slots and NVMe records that were
deleted or superseded are overwritten, live ones are untouched, and a shard reopened
after a shred recovers exactly the live records."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.host_pool import HostPool
from store.nvme import NvmeShard, NvmeShardConfig
from store.types import Lookup

SECRET = b"tenant-page-bytes-" * 50


def _files_hold(directory: Path, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in directory.glob("seg-*.akv"))


def test_scrub_free_zeroes_freed_slots_and_keeps_used_ones(pool_name) -> None:
    pool = HostPool.create(pool_name, slot_bytes=8192, num_slots=3)
    try:
        kept, dropped = pool.alloc(), pool.alloc()
        pool.write(kept, b"live" + SECRET)
        pool.write(dropped, SECRET)
        pool.free(dropped)  # released, not scrubbed: the bytes stay
        assert bytes(pool.buffer).count(SECRET) == 2
        assert pool.scrub_free() == 2  # the freed slot and the never used one
        assert bytes(pool.buffer).count(SECRET) == 1
        assert bytes(pool.read(kept)) == b"live" + SECRET
    finally:
        pool.close()
        pool.unlink()


@pytest.mark.parametrize("align", [512, 4096])
def test_shred_and_shred_dead_overwrite_nvme_payloads(tmp_path: Path, align: int) -> None:
    config = NvmeShardConfig(align=align)
    with NvmeShard(tmp_path, config) as shard:
        shard.put(b"erased", b"A" + SECRET, 1)
        shard.put(b"replaced", b"B" + SECRET, 1)
        shard.put(b"replaced", b"C-new", 1)  # the old record stays in the segment
        shard.put(b"deleted", b"D" + SECRET, 1)
        shard.delete(b"deleted")  # tombstoned only
        shard.put(b"live", b"E" + SECRET, 1)
        shard.sync()
        assert shard.shred(b"erased") is Lookup.HIT and shard.shred(b"erased") is Lookup.MISS
        assert not _files_hold(tmp_path, b"A" + SECRET)
        assert _files_hold(tmp_path, b"B" + SECRET) and _files_hold(tmp_path, b"D" + SECRET)
        assert shard.shred_dead() == 2
        assert not _files_hold(tmp_path, b"B" + SECRET)
        assert not _files_hold(tmp_path, b"D" + SECRET)
        assert shard.get(b"live") == b"E" + SECRET and shard.get(b"replaced") == b"C-new"
    with NvmeShard(tmp_path, config) as again:  # recovery: exactly the live records
        assert sorted(again.keys()) == [b"live", b"replaced"]
        assert again.get(b"live") == b"E" + SECRET


def test_arena_scrub_free_and_zero_leave_allocated_pages_alone() -> None:
    from store.hbm import HbmArena

    mark = b"one-page-of-an-erased-tenant"
    arena = HbmArena(4096, 3, "cpu")
    kept, dropped, reserved = arena.alloc(), arena.alloc(), arena.alloc()
    for page in (kept, dropped, reserved):
        arena.write(page, mark)
    arena.free(dropped)  # released: the bytes stay until scrubbed
    whole = arena.buffer.numpy().tobytes
    assert whole().count(mark) == 3
    assert arena.scrub_free() == 1
    arena.zero(reserved)  # a landing page handed to a peer: zeroed first
    assert whole().count(mark) == 1 and arena.read(kept) == mark
