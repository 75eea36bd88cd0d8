"""Host pool copies through kept slot regions (an array and a torch tensor per slot and
length): pages of any length round-trip, and closing the pool still unmaps the segment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from store import parallel
from store.host_pool import HostPool

BIG = parallel.TORCH_FROM  # from here a copy may go to torch, through the kept tensor


@pytest.fixture(autouse=True)
def _torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def pool(pool_name):
    p = HostPool.create(pool_name, slot_bytes=2 * BIG, num_slots=2)
    yield p
    p.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_pages_of_changing_lengths_round_trip_through_one_slot(pool, pool_name, threads):
    torch.set_num_threads(threads)
    reader = HostPool.attach(pool_name)
    try:
        slot = pool.alloc()
        rng = np.random.default_rng(7)
        out = np.zeros(2 * BIG, np.uint8)
        for n in (BIG, 64, 2 * BIG, BIG, 2 * BIG - 4096, 1, BIG):
            page = rng.integers(0, 256, n, dtype=np.uint8)
            version = pool.write(slot, page)
            for handle in (pool, reader):
                got, seen = handle.read_versioned(slot, out=out)
                assert seen == version and bytes(got) == page.tobytes()
                assert handle.read(slot) == page.tobytes()
            small = np.zeros(n - 1, np.uint8)
            with pytest.raises(ValueError):
                reader.read(slot, out=small)
    finally:
        reader.close()


def test_closing_unmaps_the_segment_after_large_copies(pool_name):
    torch.set_num_threads(2)
    pool = HostPool.create(pool_name, slot_bytes=BIG, num_slots=1)
    segment = pool._segment
    slot = pool.alloc()
    page = np.full(BIG, 3, np.uint8)
    pool.write(slot, page)
    assert bytes(pool.read(slot, out=np.empty(BIG, np.uint8))) == page.tobytes()
    pool.close()
    assert segment.mm.closed  # the kept regions did not pin the mapping


def test_as_bytes_passes_flat_bytes_through_and_views_the_rest():
    flat = np.arange(8, dtype=np.uint8)
    assert parallel.as_bytes(flat) is flat
    words = np.arange(4, dtype=np.uint16).reshape(2, 2)
    got = parallel.as_bytes(words)
    assert got.dtype == np.uint8 and got.shape == (8,) and np.shares_memory(got, words)
