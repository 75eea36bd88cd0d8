"""Host pool in one process: geometry, allocation, errors, stats, writer role."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store.host_pool import (
    EmptyPage,
    HostPool,
    NotWriter,
    PageTooLarge,
    PoolBusy,
    PoolFormatError,
    PoolFull,
    SlotEmpty,
)


@pytest.fixture
def pool(pool_name):
    p = HostPool.create(pool_name, slot_bytes=10_000, num_slots=3)
    yield p
    p.close()


def test_slots_are_rounded_to_whole_pages_and_prefaulted(pool, pool_name):
    assert pool.slot_bytes == 12_288 and pool.num_slots == 3
    size = os.stat(f"/dev/shm/{pool_name}").st_size
    assert size == 4096 + 4096 + 3 * 12_288
    assert os.stat(f"/dev/shm/{pool_name}").st_blocks * 512 >= size  # fallocated, not sparse


def test_write_read_versions(pool):
    slot = pool.alloc()
    assert pool.write(slot, b"one") == 1
    assert pool.write(slot, b"two!") == 2
    assert pool.read(slot) == b"two!"
    out = bytearray(100)
    view, version = pool.read_versioned(slot, out=out)
    assert bytes(view) == b"two!" and version == 2 and out[:4] == b"two!"
    arr = np.arange(100, dtype=np.uint16)
    pool.write(slot, arr)
    assert pool.read(slot) == arr.tobytes()


def test_pool_full_is_clean_and_free_makes_room(pool):
    slots = [pool.alloc() for _ in range(3)]
    for s in slots:
        pool.write(s, bytes([s]) * 10)
    with pytest.raises(PoolFull, match="all 3 slots"):
        pool.alloc()
    assert [pool.read(s) for s in slots] == [bytes([s]) * 10 for s in slots]
    pool.free(slots[1])
    assert pool.alloc() == slots[1]


def test_empty_and_freed_slots_raise_slot_empty(pool):
    slot = pool.alloc()
    with pytest.raises(SlotEmpty):
        pool.read(slot)
    pool.write(slot, b"x")
    pool.free(slot)
    with pytest.raises(SlotEmpty):
        pool.read(slot)
    with pytest.raises(SlotEmpty):
        pool.write(slot, b"y")
    with pytest.raises(SlotEmpty, match="out of range"):
        pool.read(99)


def test_bad_writes_change_nothing(pool):
    slot = pool.alloc()
    pool.write(slot, b"keep")
    with pytest.raises(PageTooLarge):
        pool.write(slot, bytes(pool.slot_bytes + 1))
    with pytest.raises(EmptyPage):
        pool.write(slot, b"")
    assert pool.read_versioned(slot) == (b"keep", 1)
    with pytest.raises(ValueError, match="out holds"):
        pool.read(slot, out=bytearray(2))


def test_stats_and_fragmentation(pool):
    a, b = pool.alloc(), pool.alloc()
    pool.write(a, bytes(pool.slot_bytes))
    pool.write(b, bytes(2048))
    stats = pool.stats()
    assert (stats.used_slots, stats.free_slots, stats.used_bytes) == (2, 1, pool.slot_bytes + 2048)
    assert stats.capacity_bytes == 3 * pool.slot_bytes
    assert stats.fragmentation == pytest.approx(
        1 - (pool.slot_bytes + 2048) / (2 * pool.slot_bytes)
    )
    assert list(pool.slots()) == [(a, 1, pool.slot_bytes), (b, 1, 2048)]


def test_reader_handle_sees_pages_but_cannot_write(pool, pool_name):
    slot = pool.alloc()
    pool.write(slot, b"shared")
    with HostPool.attach(pool_name) as reader:
        assert reader.read(slot) == b"shared" and list(reader.slots()) == [(slot, 1, 6)]
        for call in (reader.alloc, lambda: reader.write(slot, b"no"), lambda: reader.free(slot)):
            with pytest.raises(NotWriter):
                call()


def test_only_one_writer_and_takeover_rebuilds_free_queue(pool, pool_name):
    with pytest.raises(PoolBusy):
        HostPool.attach(pool_name, writer=True)
    kept = pool.alloc()
    pool.write(kept, b"kept")
    pool.close()
    with HostPool.attach(pool_name, writer=True) as writer:
        assert writer.read(kept) == b"kept"
        assert sorted([writer.alloc(), writer.alloc()]) == [s for s in range(3) if s != kept]
        with pytest.raises(PoolFull):
            writer.alloc()


def test_create_refuses_existing_and_attach_rejects_garbage(pool, pool_name):
    with pytest.raises(FileExistsError):
        HostPool.create(pool_name, 4096, 1)
    junk = f"{pool_name}-junk"
    with open(f"/dev/shm/{junk}", "wb") as f:
        f.write(b"not a pool" * 100)
    try:
        with pytest.raises(PoolFormatError):
            HostPool.attach(junk)
    finally:
        os.unlink(f"/dev/shm/{junk}")
    with pytest.raises(ValueError, match="plain file name"):
        HostPool.create("../etc", 4096, 1)


def test_unlink_keeps_existing_mappings(pool, pool_name):
    slot = pool.alloc()
    pool.write(slot, b"alive")
    pool.unlink()
    assert not os.path.exists(f"/dev/shm/{pool_name}")
    assert pool.read(slot) == b"alive"


def test_buffer_and_slot_offsets_address_the_slot_bytes(pool):
    pool.alloc()
    slot = pool.alloc()
    pool.write(slot, b"located")
    off = pool.slot_offset(slot)
    assert off == 4096 + 4096 + pool.slot_bytes
    assert pool.buffer[off : off + 7].tobytes() == b"located"
    assert pool.buffer.nbytes == 4096 + 4096 + 3 * pool.slot_bytes


def test_close_with_a_live_buffer_view_still_releases_the_writer_role(pool, pool_name):
    held = pool.buffer
    pool.close()
    with HostPool.attach(pool_name, writer=True) as writer:
        assert writer.writer
    assert held.nbytes > 0


def test_pool_larger_than_dev_shm_fails_at_create_and_leaves_nothing(pool_name):
    # 1 TiB is beyond any /dev/shm here; tmpfs refuses it up front, allocating nothing.
    with pytest.raises(PoolFull, match="cannot hold"):
        HostPool.create(pool_name, 1 << 30, 1024)
    assert not os.path.exists(f"/dev/shm/{pool_name}")


def test_scrubbing_free_zeroes_the_slot_and_plain_free_does_not(pool):
    a, b = pool.alloc(), pool.alloc()
    pool.write(a, b"secret-a")
    pool.write(b, b"secret-b")
    pool.free(a)
    pool.free(b, scrub=True)
    off_a, off_b = pool.slot_offset(a), pool.slot_offset(b)
    assert pool.buffer[off_a : off_a + 8].tobytes() == b"secret-a"
    assert not pool.buffer[off_b : off_b + pool.slot_bytes].any()
