"""Host pool zero-copy reads: ``view`` hands out the slot's bytes, ``unchanged`` says if they held."""

from __future__ import annotations

import os
import uuid

import pytest

from store.host_pool import HostPool, SlotEmpty


@pytest.fixture
def pool():
    name = f"akv-view-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    p = HostPool.create(name, slot_bytes=8192, num_slots=2)
    yield p
    p.close()
    p.unlink()


def test_view_is_the_page_in_place_read_only_and_unchanged_until_a_write(pool):
    slot = pool.alloc()
    pool.write(slot, b"first page")
    view, seq = pool.view(slot)
    assert bytes(view) == b"first page" and view.readonly
    with pytest.raises(TypeError):
        view[0] = 0
    assert pool.unchanged(slot, seq)
    off = pool.slot_offset(slot)
    assert bytes(pool.buffer[off:off + 10]) == bytes(view)  # no copy: the segment's own bytes
    pool.write(slot, b"SECOND page")
    assert not pool.unchanged(slot, seq)
    assert bytes(view) == b"SECOND pag"  # the old view now shows other bytes: caller discards
    again, seq2 = pool.view(slot)
    assert bytes(again) == b"SECOND page" and seq2 == seq + 2 and pool.unchanged(slot, seq2)


def test_free_and_reuse_move_the_sequence(pool):
    slot = pool.alloc()
    pool.write(slot, b"x" * 100)
    _, seq = pool.view(slot)
    pool.free(slot)
    assert not pool.unchanged(slot, seq)
    with pytest.raises(SlotEmpty):
        pool.view(slot)


def test_view_of_empty_unallocated_or_missing_slots_raises_slot_empty(pool):
    with pytest.raises(SlotEmpty):
        pool.view(0)  # never allocated
    slot = pool.alloc()
    with pytest.raises(SlotEmpty):
        pool.view(slot)  # allocated, nothing written
    for bad in (-1, 2):
        with pytest.raises(SlotEmpty):
            pool.view(bad)
        with pytest.raises(SlotEmpty):
            pool.unchanged(bad, 0)


def test_reader_handle_views_the_writers_pages(pool):
    slot = pool.alloc()
    pool.write(slot, b"shared")
    reader = HostPool.attach(pool.name)
    try:
        view, seq = reader.view(slot)
        assert bytes(view) == b"shared"
        pool.write(slot, b"shared, again")
        assert not reader.unchanged(slot, seq)
        del view
    finally:
        reader.close()
