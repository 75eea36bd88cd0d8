"""HBM arena: fixed-size pages carved out of one preallocated torch uint8 tensor per device."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from store.buffers import aligned_buffer
from store.types import ArenaError, PageTooLarge

__all__ = ["ArenaError", "ArenaFull", "ArenaStats", "HbmArena", "PageNotAllocated",
           "PagePinned", "PageTooLarge"]


class ArenaFull(ArenaError):
    """Every page is allocated."""


class PageNotAllocated(ArenaError, KeyError):
    """The page index is free or out of range."""


class PagePinned(ArenaError):
    """A pinned page cannot be freed until every pin is released."""


@dataclass(frozen=True, kw_only=True)
class ArenaStats:
    device: str
    page_bytes: int
    num_pages: int
    used_pages: int
    pinned_pages: int
    used_bytes: int  # bytes actually written into allocated pages

    @property
    def free_pages(self) -> int:
        return self.num_pages - self.used_pages

    @property
    def fragmentation(self) -> float:
        """Share of allocated page bytes that hold no data (internal fragmentation)."""
        held = self.used_pages * self.page_bytes
        return 0.0 if held == 0 else 1.0 - self.used_bytes / held


class HbmArena:
    """``num_pages`` pages of ``page_bytes`` in one tensor on ``device`` (default: cuda or cpu).

    alloc/free are O(1) through a FIFO free queue (oldest freed page is reused first).
    Not thread-safe: one owner (the HBM actor) drives it.

    A freed page keeps its bytes until it is scrubbed (erasure) or written again. Past its
    length a page holds only zeros once it is written (``write``, ``mark_written``): the
    arena keeps, per page, how far old bytes may reach (``_dirty``) and zeroes from the
    new length to there, so a shorter page never carries the tail of one dropped earlier.
    Bytes that arrive around ``write`` (a transport into a span, a decode into ``view``)
    are announced first with ``lend``, so that reach stays an upper bound.
    """

    def __init__(
        self, page_bytes: int, num_pages: int, device: str | torch.device | None = None
    ) -> None:
        if page_bytes <= 0 or num_pages <= 0:
            raise ValueError(
                f"page_bytes and num_pages must be positive, got {page_bytes}, {num_pages}"
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.page_bytes = page_bytes
        self.num_pages = num_pages
        # Zeroed and touched now, so first-touch faults stay off the hot path. On the CPU the
        # arena comes from ``aligned_buffer`` (2 MiB pages where the kernel allows): a pool
        # pushes restores into it by CMA, which pins the target's pages one at a time, and
        # torch's own allocation got 4 KiB pages (bench_service: raw 16 MiB pushes into the
        # arena 3.7-3.9 GB/s with torch.zeros, 4.4-4.6 with this; docs/BENCHMARKS.md).
        if self.device.type == "cpu":
            flat = torch.from_numpy(aligned_buffer(num_pages * page_bytes))
            self._buf = flat.view(num_pages, page_bytes)
        else:
            self._buf = torch.zeros((num_pages, page_bytes), dtype=torch.uint8,
                                    device=self.device)
        self._free: deque[int] = deque(range(num_pages))
        self._allocated = np.zeros(num_pages, dtype=bool)
        self._pins = np.zeros(num_pages, dtype=np.int64)
        self._lengths = np.zeros(num_pages, dtype=np.int64)
        self._dirty = np.zeros(num_pages, dtype=np.int64)  # old bytes reach at most this far

    @property
    def capacity_bytes(self) -> int:
        return self.page_bytes * self.num_pages

    @property
    def buffer(self) -> torch.Tensor:
        """The whole arena, [num_pages, page_bytes] uint8, for one transport registration."""
        return self._buf

    def page_offset(self, page: int) -> int:
        """Byte offset of ``page`` inside :attr:`buffer`."""
        self._check(page)
        return page * self.page_bytes

    def alloc(self) -> int:
        if not self._free:
            raise ArenaFull(
                f"all {self.num_pages} pages of {self.page_bytes} B on {self.device} are in use"
            )
        page = self._free.popleft()
        self._allocated[page] = True
        self._lengths[page] = 0
        return page

    def free(self, page: int, *, scrub: bool = False) -> None:
        """Return the page; ``scrub=True`` also zeroes it (erasure, not just release)."""
        self._check(page)
        if self._pins[page]:
            raise PagePinned(f"page {page} is pinned {self._pins[page]} time(s)")
        if scrub:
            self._buf[page].zero_()
            self._settle()
            self._dirty[page] = 0
        self._allocated[page] = False
        self._lengths[page] = 0
        self._free.append(page)

    def scrub_free(self) -> int:
        """Zero every free page (erasure: a page released earlier still holds its bytes
        until reused); returns how many were zeroed."""
        free = list(self._free)
        if free:
            self._buf[torch.tensor(free, device=self.device)] = 0
            self._settle()
            self._dirty[free] = 0
        return len(free)

    def zero(self, page: int) -> None:
        """Zero an allocated page now."""
        self._check(page)
        self._buf[page].zero_()
        self._settle()
        self._dirty[page] = 0

    def lend(self, page: int, nbytes: int) -> None:
        """Up to ``nbytes`` from the page's start may be written outside :meth:`write` (a
        peer's transfer into a span of it, a decode into :meth:`view`); call before they
        can arrive, then :meth:`mark_written` with what the page holds."""
        self._check(page)
        if not 0 <= nbytes <= self.page_bytes:
            raise PageTooLarge(f"{nbytes} bytes do not fit a {self.page_bytes}-byte page")
        self._dirty[page] = max(int(self._dirty[page]), nbytes)

    def _zero_past(self, page: int, nbytes: int) -> None:
        """The page holds ``nbytes``: zero whatever older bytes lie beyond them."""
        reach = int(self._dirty[page])
        if reach > nbytes:
            self._buf[page, nbytes:reach].zero_()
            self._settle()
        self._dirty[page] = nbytes

    def _settle(self) -> None:
        """Wait for zeroing queued on the device: a transport (NIXL) may write the page
        next, outside the device's stream order."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def pin(self, page: int) -> None:
        self._check(page)
        self._pins[page] += 1

    def unpin(self, page: int) -> None:
        self._check(page)
        if not self._pins[page]:
            raise ArenaError(f"page {page} is not pinned")
        self._pins[page] -= 1

    def is_pinned(self, page: int) -> bool:
        self._check(page)
        return bool(self._pins[page])

    def view(self, page: int) -> torch.Tensor:
        """The whole page as a uint8 tensor view (writes through; no copy)."""
        self._check(page)
        return self._buf[page]

    def write(
        self, page: int, data: bytes | bytearray | memoryview | np.ndarray | torch.Tensor
    ) -> int:
        """Copy ``data`` into the page (tensors of any dtype/device are copied as raw bytes)."""
        self._check(page)
        if isinstance(data, torch.Tensor):
            src = data.detach().contiguous().reshape(-1).view(torch.uint8)
        else:
            src = (
                np.frombuffer(data, dtype=np.uint8)
                if not isinstance(data, np.ndarray)
                else data.view(np.uint8).reshape(-1)
            )
        n = int(src.shape[0])
        if n > self.page_bytes:
            raise PageTooLarge(f"{n} bytes do not fit a {self.page_bytes}-byte page")
        self.lend(page, n)
        dst = self._buf[page, :n]
        if isinstance(src, torch.Tensor):
            dst.copy_(src)
        elif self.device.type == "cpu":
            dst.numpy()[:] = src
        else:
            dst.copy_(torch.from_numpy(src.copy()), non_blocking=False)
        self._zero_past(page, n)
        self._lengths[page] = n
        return n

    def read(self, page: int) -> bytes:
        """The bytes last written to the page."""
        self._check(page)
        return self._buf[page, : int(self._lengths[page])].cpu().numpy().tobytes()

    def mark_written(self, page: int, nbytes: int) -> None:
        """Record that ``nbytes`` were written into the page directly through :attr:`buffer`
        or :meth:`view` (a transport write or an in-place decode, announced with
        :meth:`lend`), so :meth:`read` and :meth:`stats` see them; older bytes past them
        are zeroed."""
        self._check(page)
        if not 0 <= nbytes <= self.page_bytes:
            raise PageTooLarge(f"{nbytes} bytes do not fit a {self.page_bytes}-byte page")
        self._zero_past(page, nbytes)
        self._lengths[page] = nbytes

    def length(self, page: int) -> int:
        self._check(page)
        return int(self._lengths[page])

    def stats(self) -> ArenaStats:
        return ArenaStats(
            device=str(self.device),
            page_bytes=self.page_bytes,
            num_pages=self.num_pages,
            used_pages=int(self._allocated.sum()),
            pinned_pages=int((self._pins > 0).sum()),
            used_bytes=int(self._lengths.sum()),
        )

    def _check(self, page: int) -> None:
        if not (0 <= page < self.num_pages) or not self._allocated[page]:
            raise PageNotAllocated(f"page {page} is not allocated in this arena")
