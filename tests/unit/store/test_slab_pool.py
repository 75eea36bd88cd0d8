"""Slab pool: size-class choice, spill-over, packed refs, stats, attach."""

from __future__ import annotations

import os
import uuid

import pytest

from store.host_pool import PageTooLarge, PoolFull, SlotEmpty
from store.slab_pool import SlabClass, SlabPool, SlabRef


@pytest.fixture
def slab():
    name = f"akv-slab-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    pool = SlabPool.create(
        name, [SlabClass(slot_bytes=65536, num_slots=1), SlabClass(slot_bytes=4096, num_slots=2)]
    )
    yield pool
    pool.close()
    pool.unlink()


def test_classes_are_sorted_and_smallest_fit_wins(slab):
    assert slab.class_bytes == (4096, 65536)
    assert slab.alloc(100) == SlabRef(0, 0)
    assert slab.alloc(4096) == SlabRef(0, 1)
    assert slab.alloc(100) == SlabRef(1, 0)  # small class full: spill into the large one
    with pytest.raises(PoolFull):
        slab.alloc(1)


def test_too_large_for_every_class(slab):
    with pytest.raises(PageTooLarge):
        slab.alloc(65537)


def test_write_read_free_and_stats(slab):
    small, big = slab.alloc(1000), slab.alloc(5000)
    assert slab.write(small, bytes(1000)) == 1 and slab.write(big, b"b" * 5000) == 1
    assert slab.read(big) == b"b" * 5000 and slab.read_versioned(small) == (bytes(1000), 1)
    stats = slab.stats()
    assert stats.used_slots == 2 and stats.used_bytes == 6000
    assert stats.capacity_bytes == 2 * 4096 + 65536
    assert stats.fragmentation == pytest.approx(1 - 6000 / (4096 + 65536))
    slab.free(big)
    with pytest.raises(SlotEmpty):
        slab.read(big)
    with pytest.raises(SlotEmpty, match="size class"):
        slab.read(SlabRef(5, 0))


def test_packed_refs_round_trip():
    ref = SlabRef(3, 123456)
    assert SlabRef.unpack(ref.packed) == ref


def test_attach_finds_every_class(slab):
    ref = slab.alloc(50_000)
    slab.write(ref, b"z" * 50_000)
    with SlabPool.attach(slab.name) as reader:
        assert reader.class_bytes == slab.class_bytes
        assert reader.read(ref) == b"z" * 50_000
    with pytest.raises(FileNotFoundError):
        SlabPool.attach(f"{slab.name}-missing")
