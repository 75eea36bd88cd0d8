"""HBM arena: O(1) FIFO alloc/free, capacity, pins, reads and writes (cpu; cuda when present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from store.hbm import ArenaError, ArenaFull, HbmArena, PageNotAllocated, PagePinned, PageTooLarge


@pytest.fixture
def arena():
    return HbmArena(page_bytes=4096, num_pages=4, device="cpu")


def test_default_device_follows_cuda_availability():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert HbmArena(64, 2).device.type == expected


def test_alloc_hands_out_every_page_then_fails_cleanly(arena):
    assert [arena.alloc() for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ArenaFull, match="all 4 pages"):
        arena.alloc()
    assert arena.stats().used_pages == 4 and arena.stats().free_pages == 0


def test_free_queue_is_fifo(arena):
    pages = [arena.alloc() for _ in range(4)]
    arena.free(pages[2])
    arena.free(pages[0])
    assert arena.alloc() == 2 and arena.alloc() == 0


def test_write_read_and_view_share_bytes(arena):
    page = arena.alloc()
    assert arena.write(page, b"abc") == 3
    assert arena.read(page) == b"abc" and arena.length(page) == 3
    arena.view(page)[:3] = torch.tensor([120, 121, 122], dtype=torch.uint8)
    assert arena.read(page) == b"xyz"
    t = torch.arange(8, dtype=torch.float16)
    arena.write(page, t)
    assert arena.read(page) == t.numpy().tobytes()
    arena.write(page, np.arange(5, dtype=np.uint8))
    assert arena.read(page) == bytes(range(5))


def test_whole_buffer_and_offsets_address_the_same_bytes(arena):
    arena.alloc()
    page = arena.alloc()
    arena.write(page, b"here")
    flat = arena.buffer.reshape(-1)
    off = arena.page_offset(page)
    assert off == 4096 and bytes(flat[off : off + 4].numpy()) == b"here"
    assert arena.buffer.shape == (4, 4096) and arena.buffer.dtype == torch.uint8


def test_too_large_write_changes_nothing(arena):
    page = arena.alloc()
    arena.write(page, b"keep")
    with pytest.raises(PageTooLarge):
        arena.write(page, bytes(4097))
    assert arena.read(page) == b"keep"


def test_pins_block_free_until_released(arena):
    page = arena.alloc()
    arena.pin(page)
    arena.pin(page)
    assert arena.is_pinned(page) and arena.stats().pinned_pages == 1
    arena.unpin(page)
    with pytest.raises(PagePinned, match="1 time"):
        arena.free(page)
    arena.unpin(page)
    arena.free(page)
    with pytest.raises(ArenaError, match="not allocated"):
        arena.unpin(page)


def test_freed_or_unknown_pages_are_rejected(arena):
    page = arena.alloc()
    arena.free(page)
    for bad in (page, -1, 4):
        with pytest.raises(PageNotAllocated):
            arena.read(bad)
    with pytest.raises(PageNotAllocated):
        arena.free(page)


def test_scrubbing_free_zeroes_the_page(arena):
    a, b = arena.alloc(), arena.alloc()
    arena.write(a, b"left")
    arena.write(b, b"gone")
    arena.free(a)
    arena.free(b, scrub=True)
    assert bytes(arena.buffer[a, :4].numpy()) == b"left"
    assert not bool(arena.buffer[b].any())


def test_scrub_free_zeroes_released_pages_and_keeps_live_ones(arena):
    a, b, c = arena.alloc(), arena.alloc(), arena.alloc()
    for page, data in ((a, b"live"), (b, b"old1"), (c, b"old2")):
        arena.write(page, data)
    arena.free(b)
    arena.free(c)
    assert arena.scrub_free() == 3  # b, c and the never-used fourth page
    assert bytes(arena.buffer[a, :4].numpy()) == b"live"
    assert not bool(arena.buffer[b].any()) and not bool(arena.buffer[c].any())


def test_stats_report_fragmentation(arena):
    a, b = arena.alloc(), arena.alloc()
    arena.write(a, bytes(4096))
    arena.write(b, bytes(1024))
    stats = arena.stats()
    assert stats.used_bytes == 5120 and stats.fragmentation == pytest.approx(1 - 5120 / 8192)


def test_mark_written_records_bytes_written_through_the_buffer(arena):
    page = arena.alloc()
    off = arena.page_offset(page)
    arena.buffer.view(-1)[off:off + 5].copy_(torch.frombuffer(bytearray(b"bytes"), dtype=torch.uint8))
    assert arena.read(page) == b""  # not yet recorded
    arena.mark_written(page, 5)
    assert arena.read(page) == b"bytes" and arena.length(page) == 5
    assert arena.stats().used_bytes == 5
    with pytest.raises(PageTooLarge):
        arena.mark_written(page, 4097)
    assert arena.length(page) == 5  # a refused call changes nothing
    arena.free(page)
    with pytest.raises(PageNotAllocated):
        arena.mark_written(page, 1)


def test_bad_geometry_is_rejected():
    with pytest.raises(ValueError):
        HbmArena(0, 4)


@pytest.mark.gpu
def test_cuda_arena_round_trips_device_tensors():
    arena = HbmArena(1 << 20, 2, device="cuda")
    page = arena.alloc()
    t = torch.randn(1024, device="cuda")
    arena.write(page, t)
    assert arena.view(page).is_cuda
    assert arena.read(page) == t.cpu().numpy().tobytes()
    arena.write(page, b"host bytes")
    assert arena.read(page) == b"host bytes"


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``addr``."""
    flags: list[str] | None = None
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    assert flags is not None, f"no mapping holds {addr:#x}"
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_cpu_arena_asks_for_huge_pages() -> None:
    """Peers copy into the arena by CMA, which pins its pages one at a time: the CPU
    arena is 2 MiB aligned and advised MADV_HUGEPAGE (VmFlags ``hg``), as the store's
    other bulk buffers are."""
    from store import buffers

    if not buffers.HUGE_PAGES:
        pytest.skip("AGENTKV_HUGE_PAGES=0 turns the advice off")
    arena = HbmArena(1 << 20, 8, device="cpu")
    addr = arena.buffer.data_ptr()
    assert addr % buffers.HUGE_PAGE == 0
    assert "hg" in _vm_flags(addr)
    arena.write(arena.alloc(), b"kv")  # still an ordinary arena
    assert arena.buffer.shape == (8, 1 << 20) and arena.buffer.dtype == torch.uint8


def test_a_shorter_page_never_carries_the_tail_of_the_page_before(arena):
    old = b"O" * 4096
    page = arena.alloc()
    arena.write(page, old)
    arena.free(page)  # released, not scrubbed: its bytes stay until the page is written
    for _ in range(3):
        arena.free(arena.alloc())  # the FIFO hands out the same page again below
    again = arena.alloc()
    assert again == page and bytes(arena.view(page).numpy()) == old
    arena.write(page, b"new")
    assert bytes(arena.view(page).numpy()) == b"new" + bytes(4093)
    assert arena.read(page) == b"new"


def test_bytes_lent_to_a_peer_are_zeroed_past_what_the_page_turns_out_to_hold(arena):
    page = arena.alloc()
    arena.write(page, b"x" * 100)
    arena.lend(page, 4096)  # a peer may write anywhere in the page (a landing page)
    arena.view(page)[:3000] = 7  # it wrote 3000 bytes
    arena.mark_written(page, 2000)  # the page holds 2000: the rest goes, old and new alike
    view = arena.view(page).numpy()
    assert (view[:2000] == 7).all() and not view[2000:].any()
    with pytest.raises(PageTooLarge):
        arena.lend(page, 4097)


def test_the_reach_of_old_bytes_only_grows_until_a_scrub(arena):
    page = arena.alloc()
    arena.write(page, b"y" * 4000)
    arena.write(page, b"z" * 10)  # zeroes 10..4000 once; the reach is now 10
    arena.view(page)[:] = 1  # written around the arena without ``lend``: not its promise
    arena.write(page, b"w" * 5)
    assert bytes(arena.view(page).numpy()[:12]) == b"wwwww" + b"\x00" * 5 + b"\x01\x01"
    arena.zero(page)
    assert not arena.view(page).numpy().any()
