"""Page-aligned, pre-faulted buffers: the one place the store allocates bulk memory.

First-touch memory costs 3-6 us per 4 KiB page on these machines, and a read into a buffer
that starts a few bytes into a page is several times slower, so every bulk buffer (read
scratch, sealed-record buffers, staging, transport registrations) comes from here:
private anonymous ``mmap`` memory, page aligned and touched once up front. (Private: a
plain ``mmap.mmap(-1, n)`` is a *shared* anonymous mapping, which Linux backs with shmem,
where transparent huge pages follow ``shmem_enabled``, "never" on these machines.)

From ``HUGE_FROM`` up the buffer is aligned to 2 MiB and advised ``MADV_HUGEPAGE``: where
the kernel's transparent huge pages are in ``madvise`` mode (or ``always``) it is then
backed by 2 MiB pages, which pre-fault 512 times faster and which another process reading
or writing the buffer by CMA (``process_vm_readv``: NIXL UCX between processes) pins one
at a time instead of 512 small ones. Where THP is off the advice is a no-op;
``AGENTKV_HUGE_PAGES=0`` turns it off here too (the buffers stay 4 KiB aligned).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

HUGE_PAGE = 2 << 20
HUGE_FROM = HUGE_PAGE  # smaller buffers stay on 4 KiB pages
_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
HUGE_PAGES = os.environ.get("AGENTKV_HUGE_PAGES", "1").lower() not in ("0", "false", "no", "off")


def aligned_buffer(n: int) -> np.ndarray:
    """``n`` zeroed bytes, page aligned (2 MiB aligned from ``HUGE_FROM``), pre-faulted."""
    if n < 0:
        raise ValueError(f"buffer size must be >= 0, got {n}")
    if n < HUGE_FROM or not HUGE_PAGES:
        buf = np.frombuffer(mmap.mmap(-1, max(n, 1), flags=_PRIVATE), dtype=np.uint8)[:n]
        buf[:] = 0
        return buf
    mm = mmap.mmap(-1, n + HUGE_PAGE, flags=_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without THP
            pass
    whole = np.frombuffer(mm, dtype=np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    buf = whole[start : start + n]
    buf[:] = 0  # pre-fault (only these pages: the slack before and after is never touched)
    return buf
