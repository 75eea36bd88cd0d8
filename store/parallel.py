"""Copies on all cores: large byte copies split across a small shared thread pool.

numpy copies of plain bytes release the GIL, so a 16 MiB page copied as a few slices on
as many threads as the process may run on moves at the machine's memory bandwidth rather
than one core's. The calling thread copies too (it takes slices like the helpers), so a
helper that wakes late costs little and a busy pool never blocks a copy.

Python helper threads take tens of microseconds to wake, more than half of a 2 MiB copy;
torch's intra-op threads are already spinning, so torch ``copy_`` splits a 2 MiB copy
across cores at cache speed (2.3-2.5x one thread on the 2-core machine), but it splits
statically and waits for every thread: on an oversubscribed machine one descheduled
thread stalls the whole copy (medians of 0.2-1 GB/s were measured at load 5-9). So
large copies go to whichever of the two engines has been faster for their size class
lately (:class:`EngineChoice`), and the other one is tried now and then, more rarely
the slower it was. torch is used only in processes that have loaded it (this module
never imports it: a process that only moves bytes does not pay for it) and that run it
on more than one thread (Ray workers get one unless their actor asks for more).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# Smaller copies stay on the calling thread: at 2 MiB, waking a helper cost more than it
# saved on the shared 2-core machine (one thread 11.8-13.3 GB/s, two 7.5-9.5, load 7-9).
PARALLEL_FROM = 4 << 20
SLICE_MIN = 512 << 10
# Copies from here up may go to torch's intra-op threads (below it one thread is as fast).
TORCH_FROM = 1 << 20


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


class Engine(Enum):
    """How a large copy is split across cores."""

    FAN = "fan"  # slices on the caller and the helper pool (one thread below PARALLEL_FROM)
    TORCH = "torch"  # torch ``copy_`` on its intra-op threads


class EngineChoice:
    """Which engine copies each size class (sizes of one bit length), from recent timings.

    Keeps the last ``WINDOW`` times (seconds per byte) of each engine per class and uses
    the one with the lower median. Every so often the other engine copies instead, so a
    change of load is noticed: after ``EXPLORE`` copies times the ratio of the two
    medians (capped at ``EXPLORE_MAX``), which keeps the cost of trying a slow engine to
    about 1/EXPLORE of the copy time. Pure bookkeeping: the caller times the copies."""

    WINDOW = 8
    # Timed copies each engine makes first, after one that is not timed: torch starts its
    # threads on its first copy, which took 8-9 ms of 16 MiB against 0.6 ms after, and that
    # sample decided the warm-up's median for the one-core fan in 1 process of 3.
    WARMUP = 3
    # 1/64 of the copy time: at 16, trying a 2 MiB fan copy 6x slower than torch's cost
    # 1.8 us per copy on average, 6 % of a 30 us copy
    EXPLORE = 64
    EXPLORE_MAX = 4096
    SAMPLE = 4  # the preferred engine's copies are timed one in SAMPLE (its trials always)

    def __init__(self) -> None:
        self._classes: dict[int, _SizeClass] = {}

    def _class(self, size_class: int) -> _SizeClass:
        c = self._classes.get(size_class)
        if c is None:
            c = self._classes[size_class] = _SizeClass(self.WINDOW)
        return c

    def pick(self, size_class: int) -> tuple[Engine, bool]:
        """The engine for the next copy of the class, and whether to time it."""
        c = self._classes.get(size_class) or self._class(size_class)
        c.count += 1
        if c.best is None:  # warm-up: each engine in turn until both have WARMUP times
            i = int(len(c.times[0]) >= self.WARMUP)
            first, c.started[i] = not c.started[i], True
            return _ENGINES[i], not first
        if c.count >= c.next_try:
            return _ENGINES[1 - c.best], True
        return _ENGINES[c.best], c.count % self.SAMPLE == 0

    def record(self, size_class: int, engine: Engine, seconds_per_byte: float) -> None:
        c = self._class(size_class)
        i = _INDEX[engine]
        times = c.times[i]
        times.append(seconds_per_byte)
        c.medians[i] = sorted(times)[len(times) // 2]
        if len(c.times[0]) < self.WARMUP or len(c.times[1]) < self.WARMUP:
            return
        fan, tensor = c.medians
        best = 0 if fan <= tensor else 1
        if c.best is None or i != best:  # decided, or a trial lost: wait before the next
            slow = max(fan, tensor) / max(min(fan, tensor), 1e-15)
            c.next_try = c.count + min(self.EXPLORE_MAX, int(self.EXPLORE * slow))
        c.best = best

    def best(self, size_class: int) -> Engine | None:
        """The engine now preferred for the class (None until both were timed)."""
        c = self._classes.get(size_class)
        return None if c is None or c.best is None else _ENGINES[c.best]


class _SizeClass:
    __slots__ = ("best", "count", "medians", "next_try", "started", "times")

    def __init__(self, window: int) -> None:
        self.times = (deque(maxlen=window), deque(maxlen=window))  # FAN, TORCH
        self.started = [False, False]  # each engine's untimed first copy made
        self.medians = [0.0, 0.0]
        self.best: int | None = None
        self.count = self.next_try = 0


_ENGINES = (Engine.FAN, Engine.TORCH)
_INDEX = {Engine.FAN: 0, Engine.TORCH: 1}
_TORCH = Engine.TORCH  # a module global: cheaper on every copy than the enum's attribute


CHOICE = EngineChoice()


def copy_into(dst: np.ndarray, src: np.ndarray, threads: int | None = None, *,
              dst_tensor: torch.Tensor | None = None,
              src_tensor: torch.Tensor | None = None) -> None:
    """``dst[:] = src`` for flat uint8 arrays of one length, on up to ``threads`` threads
    (all cores by default, by the engine that has lately been faster for the size).
    ``dst_tensor`` / ``src_tensor``: a tensor over the same bytes (:func:`tensor_over`),
    for a caller that copies one region again and again (a pool slot)."""
    n = src.shape[0]
    if n < TORCH_FROM and n < PARALLEL_FROM:  # small: one thread, whatever the engine
        np.copyto(dst, src)
        return
    torch_ = sys.modules.get("torch")  # only where torch is loaded: never import it here
    if (threads is not None or n < TORCH_FROM or THREADS < 2 or torch_ is None
            or torch_.get_num_threads() < 2):
        _fan_copy(dst, src, THREADS if threads is None else threads)
        return
    size_class = n.bit_length()
    engine, timed = CHOICE.pick(size_class)
    start = time.perf_counter() if timed else 0.0
    if engine is _TORCH:
        if dst_tensor is None:
            dst_tensor = torch_.from_numpy(dst)
        dst_tensor.copy_(_source_tensor(torch_, src) if src_tensor is None else src_tensor)
    else:
        _fan_copy(dst, src, THREADS)
    if timed:
        CHOICE.record(size_class, engine, (time.perf_counter() - start) / n)


def tensor_over(region: np.ndarray) -> torch.Tensor | None:
    """A tensor over ``region`` for :func:`copy_into`, or None where no copy of it would go
    to torch (torch not loaded, or a region under ``TORCH_FROM``). Made once for a region
    copied again and again, it saves ``torch.from_numpy`` and a new tensor on every copy
    (about 1.4 us of a 2 MiB copy's 33 us). The tensor keeps ``region`` alive: whoever
    keeps it drops it before unmapping the memory."""
    torch_ = sys.modules.get("torch")
    if torch_ is None or region.shape[0] < TORCH_FROM:
        return None
    return _source_tensor(torch_, region)


def _source_tensor(torch_: Any, src: np.ndarray) -> torch.Tensor:
    """A tensor over ``src``, which may be read-only (bytes, a reader's view of the pool).

    torch warns once per process when it wraps a read-only array, about writes through
    the tensor; this module only reads it, so the first such wrap is made quietly."""
    global _WRAPPED_READ_ONLY
    if _WRAPPED_READ_ONLY or src.flags.writeable:
        return torch_.from_numpy(src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch_.from_numpy(src)
    _WRAPPED_READ_ONLY = True
    return tensor


_WRAPPED_READ_ONLY = False


def _fan_copy(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    n = src.shape[0]
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


_UINT8 = np.dtype(np.uint8)


def as_bytes(buf: object) -> np.ndarray:
    """A flat uint8 array over any C-contiguous buffer (no copy)."""
    if type(buf) is np.ndarray and buf.dtype is _UINT8 and buf.ndim == 1:
        return buf  # already one: what the store passes on every put and get (1.3 us saved)
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, np.uint8)  # type: ignore[call-overload]
