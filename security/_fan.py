"""Run ``fn(0..count-1)`` on the calling thread and a few helper threads (sealing chunks).

The same scheme as ``store.parallel.Fan``: ``security`` imports nothing from ``store``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Fan:
    """Runs ``fn(0..count-1)`` on the calling thread and the pool's helpers: each takes the
    next index. The caller waits only for indices a helper claimed and has not finished,
    never for a helper that has not woken yet (it then finds nothing left to do)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, count: int, fn: Callable[[int], None], parallel: bool) -> None:
        if not parallel or count < 2 or self.threads < 2:
            for i in range(count):
                fn(i)
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="akv-seal")
        state = {"next": 0, "pending": 0, "error": None}
        done = threading.Condition(threading.Lock())

        def work() -> None:
            while True:
                with done:
                    if state["next"] >= count or state["error"] is not None:
                        return
                    i = state["next"]
                    state["next"] += 1
                    state["pending"] += 1
                try:
                    fn(i)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    state["error"] = exc
                finally:
                    with done:
                        state["pending"] -= 1
                        if not state["pending"]:
                            done.notify_all()

        for _ in range(min(self.threads - 1, count - 1)):
            self._pool.submit(work)
        work()
        with done:
            while state["pending"]:
                done.wait()
        if state["error"] is not None:
            raise state["error"]  # type: ignore[misc]
