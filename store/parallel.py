"""Copies on all cores: large byte copies split across a small shared thread pool.

numpy copies of plain bytes release the GIL, so a 16 MiB page copied as a few slices on
as many threads as the process may run on moves at the machine's memory bandwidth rather
than one core's. The calling thread copies too (it takes slices like the helpers), so a
helper that wakes late costs little and a busy pool never blocks a copy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Smaller copies stay on the calling thread: at 2 MiB, waking a helper cost more than it
# saved on the shared 2-core machine (one thread 11.8-13.3 GB/s, two 7.5-9.5, load 7-9).
PARALLEL_FROM = 4 << 20
SLICE_MIN = 512 << 10


def _threads() -> int:
    env = os.environ.get("AGENTKV_COPY_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


THREADS = _threads()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, THREADS - 1), thread_name_prefix="akv-copy")
        return _pool


class Fan:
    """``fn(0..count-1)`` on the calling thread and up to ``helpers`` pool threads. Each
    thread claims the next index; the caller waits only for indices a helper has claimed
    and not finished, never for a helper that has not woken yet (on a busy machine a
    helper may wake after the caller did all the work: it then finds nothing to do)."""

    __slots__ = ("_count", "_done", "_error", "_fn", "_next", "_pending")

    def __init__(self, count: int, fn: Callable[[int], None]) -> None:
        self._count, self._fn = count, fn
        self._next = self._pending = 0
        self._done = threading.Condition(threading.Lock())
        self._error: BaseException | None = None

    def run(self, helpers: int, pool: ThreadPoolExecutor) -> None:
        for _ in range(min(helpers, self._count - 1)):
            pool.submit(self._work)
        self._work()
        with self._done:
            while self._pending:
                self._done.wait()
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while True:
            with self._done:
                if self._next >= self._count or self._error is not None:
                    return
                i, self._next = self._next, self._next + 1
                self._pending += 1
            try:
                self._fn(i)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self._error = exc
            finally:
                with self._done:
                    self._pending -= 1
                    if not self._pending:
                        self._done.notify_all()


def fan_out(count: int, fn: Callable[[int], None], threads: int | None = None) -> None:
    """Run ``fn(i)`` for i in 0..count-1 on up to ``threads`` threads (the caller's too)."""
    threads = THREADS if threads is None else min(threads, THREADS)
    if count < 2 or threads < 2:
        for i in range(count):
            fn(i)
        return
    Fan(count, fn).run(threads - 1, _helpers())


def copy_into(dst: np.ndarray, src: np.ndarray, threads: int | None = None) -> None:
    """``dst[:] = src`` for flat uint8 arrays of one length, on up to ``threads`` threads."""
    n = src.shape[0]
    threads = THREADS if threads is None else threads
    if n < PARALLEL_FROM or threads < 2:
        np.copyto(dst, src)
        return
    parts = min(threads * 2, max(2, n // SLICE_MIN))
    step = -(-n // parts)
    step = -(-step // 4096) * 4096  # page-aligned slices
    parts = -(-n // step)

    def one(i: int) -> None:
        lo = i * step
        np.copyto(dst[lo:lo + step], src[lo:lo + step])

    fan_out(parts, one, threads)


def as_bytes(buf: object) -> np.ndarray:
    """A flat uint8 array over any C-contiguous buffer (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, np.uint8)  # type: ignore[call-overload]
