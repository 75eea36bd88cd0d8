"""Host pool reserve -> fill in place -> commit (or abort), and copies on every core."""

from __future__ import annotations

import subprocess
import threading

import numpy as np
import pytest

from store import parallel
from store.host_pool import (
    EmptyPage,
    HostPool,
    NotWriter,
    PageTooLarge,
    PoolError,
    SlotEmpty,
    TornRead,
)


@pytest.fixture
def pool(pool_name):
    p = HostPool.create(pool_name, slot_bytes=3 << 20, num_slots=2)
    yield p
    p.close()


def test_reserve_hands_out_the_slot_itself_and_commit_publishes(pool):
    slot = pool.alloc()
    view = pool.reserve(slot, 5000)
    assert view.shape == (5000,) and np.shares_memory(view, pool.buffer)
    view[:] = 9  # the producer writes straight into the pool
    assert pool.commit(slot, 4000) == 1  # a prefix of the reservation is the page
    assert pool.read(slot) == bytes([9]) * 4000
    pool.reserve(slot, 10)[:] = 1
    assert pool.commit(slot, 10) == 2 and pool.read(slot) == bytes([1]) * 10


def test_commit_publishes_nothing_past_the_reservation(pool):
    """Found by review: commit checked only the slot size, so a commit longer than the
    reservation published bytes the producer never wrote (the slot's previous page, when
    it was freed without a scrub). Refused, and the reservation still stands."""
    slot = pool.alloc()
    pool.write(slot, b"SECRET-OF-THE-PREVIOUS-PAGE" * 100)
    pool.free(slot)  # a plain free: its bytes stay
    slot = pool.alloc()
    pool.reserve(slot, 4)[:] = np.frombuffer(b"new!", np.uint8)
    with pytest.raises(PageTooLarge, match="reserved"):
        pool.commit(slot, 8192)
    pool.commit(slot, 4)
    assert pool.read(slot) == b"new!"


def test_readers_wait_for_a_reservation_and_never_see_it_half_written(pool, pool_name):
    slot = pool.alloc()
    pool.write(slot, b"old page")
    view = pool.reserve(slot, 8)
    view[:4] = np.frombuffer(b"new ", np.uint8)
    reader = HostPool.attach(pool_name)
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(bytes(reader.read(slot))))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not got  # the seqlock is odd: the reader waits
    view[4:] = np.frombuffer(b"page", np.uint8)
    pool.commit(slot, 8)
    thread.join(5)
    assert got == [b"new page"]
    reader.close()


def test_abort_leaves_an_allocated_empty_slot(pool):
    slot = pool.alloc()
    pool.write(slot, b"x")
    pool.reserve(slot, 100)[:] = 5
    pool.abort(slot)
    with pytest.raises(SlotEmpty):
        pool.read(slot)
    assert pool.stats().used_slots == 1
    pool.write(slot, b"again")  # still the caller's slot
    assert pool.read(slot) == b"again"


def test_reservation_misuse_is_refused(pool, pool_name):
    slot = pool.alloc()
    with pytest.raises(PageTooLarge):
        pool.reserve(slot, pool.slot_bytes + 1)
    with pytest.raises(EmptyPage):
        pool.reserve(slot, 0)
    with pytest.raises(SlotEmpty):
        pool.reserve(1 - slot, 10)  # not allocated
    with pytest.raises(PoolError, match="not reserved"):
        pool.commit(slot, 10)
    with pytest.raises(PoolError, match="not reserved"):
        pool.abort(slot)
    pool.reserve(slot, 10)
    with pytest.raises(PoolError, match="already reserved"):
        pool.reserve(slot, 10)
    with pytest.raises(PageTooLarge):
        pool.commit(slot, pool.slot_bytes + 1)
    pool.commit(slot, 10)
    reader = HostPool.attach(pool_name)
    with pytest.raises(NotWriter):
        reader.reserve(slot, 10)
    reader.close()


def test_a_writer_that_dies_mid_reservation_leaves_a_torn_slot(pool, pool_name):
    slot = pool.alloc()
    pool.reserve(slot, 10)
    gone = subprocess.Popen(["true"])
    gone.wait()
    pool._words[slot * 8 + 4] = gone.pid  # PID word: a writer that no longer exists
    reader = HostPool.attach(pool_name)
    with pytest.raises(TornRead):
        reader.read(slot)
    reader.close()


@pytest.mark.parametrize("n", [0, 1, 4095, (4 << 20) - 1, 4 << 20, (9 << 20) + 7])
def test_parallel_copy_is_a_copy(n):
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n + 16, np.uint8)
    parallel.copy_into(dst[:n], src)
    assert np.array_equal(dst[:n], src) and not dst[n:].any()
    for threads in (1, 2, 3):
        out = np.zeros(n, np.uint8)
        parallel.copy_into(out, src, threads=threads)
        assert np.array_equal(out, src)
