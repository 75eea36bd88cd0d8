"""store.buffers.aligned_buffer: zeroed, page aligned, private memory that may take huge pages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from store.buffers import HUGE_PAGE, aligned_buffer

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping_of(addr: int) -> dict[str, str]:
    """The /proc/self/smaps entry (header flags and fields) of the mapping holding ``addr``."""
    text = Path("/proc/self/smaps").read_text()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split()[0].split("-"))
        if lo <= addr < hi:
            fields = dict(line.split(":", 1) for line in block.splitlines()[1:] if ":" in line)
            return {"perms": block.split()[1], **{k: v.strip() for k, v in fields.items()}}
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 1 << 20, HUGE_PAGE, 5 * HUGE_PAGE + 123])
def test_aligned_buffers_are_zeroed_flat_and_page_aligned(n):
    buf = aligned_buffer(n)
    assert buf.dtype == np.uint8 and buf.shape == (n,) and not buf.any()
    assert buf.ctypes.data % 4096 == 0
    if n >= HUGE_PAGE:
        assert buf.ctypes.data % HUGE_PAGE == 0
    buf[:] = 7  # writable, all of it
    assert int(buf.sum()) == 7 * n


def test_large_buffers_are_private_memory_eligible_for_huge_pages():
    """A shared anonymous mapping (``mmap.mmap(-1, n)``) is shmem, which never takes
    transparent huge pages here: the buffers must be private."""
    if not _THP.exists() or "[never]" in _THP.read_text():
        pytest.skip("transparent huge pages are off on this kernel")
    buf = aligned_buffer(4 * HUGE_PAGE)
    mapping = _mapping_of(buf.ctypes.data)
    assert mapping["perms"].endswith("p"), mapping["perms"]  # private, not shared
    assert mapping.get("THPeligible") == "1"


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError):
        aligned_buffer(-1)
