"""A pool's side of the directory: its writes, and the repair loop that keeps them published.

The pool's own index is the truth for its copies; the directory is the shared hint other
nodes read for cross-node prefix sharing. A write that fails (Redis unreachable for a
moment, the directory actor gone) leaves the publisher **stale**; a server that lost
writes it had acknowledged (restarted from an older snapshot or empty, flushed, a key
deleted by hand) is found by the backend's ``lost_writes``; a namespace erased on purpose
(tenant erasure) is not a loss and is not republished. Copies found at start-up (a
restarted actor) leave it stale too: nothing in this process has written their entries,
so nothing here could see them lost. Either way the publisher's own thread has the pool
republish everything it holds once the directory answers, backing off between attempts;
the store path only sets a flag and never waits for it. This loop is the one owner of
the pool's entries: the head's ``DirectoryWatch`` reports outages and emptied restarts
but need not republish. A directory that refuses writes (``WritesRefused``: Redis out of
memory, a read-only replica, failing persistence) is logged at error level once per streak, whatever failed before it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentkv_cluster.runtime.directory_glue import GUARD_BACKOFF, Backoff

log = logging.getLogger(__name__)


class PoolPublisher:
    """A pool's writes to the directory: best effort, and never made under the pool's lock
    (each is a round trip to Redis or the directory actor, several milliseconds on a busy
    node). ``start(republish)`` runs the repair loop (``sync``) in a thread of its own."""

    def __init__(self, directory: Any, *, interval_s: float = 5.0,
                 backoff: Backoff = GUARD_BACKOFF) -> None:
        self.directory = directory
        self.interval_s = interval_s  # between checks for lost writes while all is well
        self.backoff = backoff  # between republish attempts while the directory fails
        self.stale = False  # a write failed: the directory misses some of this pool's copies
        self.reads = 0  # generation reads made (tests, stats)
        self.repairs = 0  # republishes the repair loop made (tests, stats)
        self._seen: dict[str, int] = {}  # blinded namespace -> highest generation it had here
        self._current: dict[str, int] = {}  # blinded namespace -> generation new entries carry
        self._repair = threading.Lock()
        self._state = threading.Lock()
        self._failures = 0  # failed writes so far; a republish clears only those before it
        self._delay: float | None = None
        self._refused = False  # the last republish was refused for memory (logged once)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- generations ---------------------------------------------------------------------------
    def saw(self, namespace: str, generation: int) -> None:
        """A copy of ``namespace`` carries ``generation`` (found on the tiers at start-up)."""
        self._seen[namespace] = max(self._seen.get(namespace, 0), generation)

    def generation(self, namespace: str) -> int:
        """The generation a new entry of ``namespace`` carries, never lower than one this
        pool has used (an emptied directory is advanced back). The first store of a
        namespace reads it (and opens it, once per pool however many stores race to it);
        later stores reuse it without a round trip. Only pools open or advance generations,
        and never backwards, so it stays valid until the directory refuses an entry for its
        generation (emptied, or sealed by an operator): ``put`` then reads it again."""
        gen = self._current.get(namespace)
        if gen is not None:
            return gen
        try:
            self.reads += 1
            gen = self.directory.current_generation(namespace)
            if gen == 0 or gen < self._seen.get(namespace, 0):
                with self._repair:
                    gen = self._repaired(namespace)
            self._current[namespace] = gen
        except Exception:  # noqa: BLE001 - directory unreachable: keep the last known one
            self.failed()
            gen = max(1, self._seen.get(namespace, 1))
        self.saw(namespace, gen)
        return gen

    def _repaired(self, namespace: str) -> int:
        gen, seen = self.directory.current_generation(namespace), self._seen.get(namespace, 0)
        if gen < seen:  # an emptied Redis: never go backwards
            self.directory.advance_generation(namespace, seen)
            return seen
        return self.directory.open_generation(namespace) if gen == 0 else gen

    # -- writes --------------------------------------------------------------------------------
    def put(self, entry: Any) -> None:
        """Publish ``entry``. Refused for its generation, the generation is read (and
        repaired) again and the entry retried if it still carries the current one; one
        that does not (sealed meanwhile) stays unpublished, like a write in an outage."""
        from store.directory.base import GenerationRegression, ReadOnlyGeneration, UnknownGeneration

        try:
            self.directory.put(entry)
        except (UnknownGeneration, ReadOnlyGeneration, GenerationRegression):
            self._current.pop(entry.tenant_ns, None)
            if self.generation(entry.tenant_ns) != entry.generation:
                self.failed()
                return
            self._publish(lambda: self.directory.put(entry))
        except Exception:  # noqa: BLE001 - Redis down, actor gone: the data path goes on
            self.failed()

    def delete(self, namespace: str, key: bytes) -> None:
        self._publish(lambda: self.directory.delete(namespace, key))

    def restore(self, entries: Sequence[Any]) -> None:
        """Re-insert ``entries`` (a republish), each namespace's generation first raised to
        the highest its entries carry (one read per namespace). Raises on failure, unlike
        ``put``: the caller retries the whole republish."""
        top: dict[str, int] = {}
        for entry in entries:
            top[entry.tenant_ns] = max(top.get(entry.tenant_ns, 0), entry.generation)
        for namespace, generation in top.items():
            if self.directory.current_generation(namespace) < generation:
                self.directory.advance_generation(namespace, generation)
        self.directory.restore(list(entries))

    def _publish(self, write: Callable[[], Any]) -> None:
        try:
            write()
        except Exception:  # noqa: BLE001 - Redis down, actor gone: the data path goes on
            self.failed()

    def failed(self) -> None:
        """A write did not reach the directory: stale until a republish that starts later
        succeeds. Wakes the repair loop (it backs off from here); never blocks."""
        with self._state:
            first, self.stale = not self.stale, True
            self._failures += 1
        if first:
            self._wake.set()

    # -- republishing ----------------------------------------------------------------------------
    def republishing(self) -> int:
        """Call when a republish starts; hand the token to ``republished`` when it is done."""
        with self._state:
            return self._failures

    def republished(self, token: int) -> None:
        """A republish that started at ``token`` succeeded: fresh, unless a write failed
        meanwhile (that copy may have been missed)."""
        with self._state:
            if self._failures == token:
                self.stale = False

    def sync(self, republish: Callable[[], int]) -> float:
        """One round of the repair loop: ask the backend for lost writes, republish when
        stale; returns how long to wait before the next round (``interval_s`` while all is
        well, the growing backoff while the directory fails)."""
        check = getattr(self.directory, "lost_writes", None)
        try:
            lost = check() if check is not None else []
        except Exception:  # noqa: BLE001 - unreachable now: try again after the backoff
            return self._retry_later()
        if lost:
            log.error("the directory lost writes of this pool in %d namespaces (restarted from "
                      "an older snapshot or empty, flushed, or keys deleted); republishing",
                      len(lost))
            self.failed()
        if not self.stale:
            self._delay = None
            return self.interval_s
        from store.directory.base import WritesRefused

        try:
            n = republish()
        except WritesRefused as exc:
            delay = self._retry_later()
            if not self._refused:
                log.error("the directory refuses this pool's writes (%s); its copies stay "
                          "unpublished, other nodes cannot share them; retrying in %.1f s",
                          exc, delay)
            self._refused = True
            return delay
        except Exception as exc:  # noqa: BLE001 - the pool's guard may still be backing off
            level = logging.WARNING if self._delay is None else logging.DEBUG  # once a streak
            delay = self._retry_later()
            log.log(level, "republishing this pool's directory entries failed (%s: %s); "
                    "retrying in %.1f s", type(exc).__name__, exc, delay)
            return delay
        self._refused = False
        self.repairs += 1
        log.warning("republished %s directory entries of this pool (failed or lost writes, "
                    "or copies found at start-up)", n)
        if self.stale:  # a write failed while it ran: that copy may be missing, go again
            return self._retry_later()
        self._delay = None
        return self.interval_s

    def _retry_later(self) -> float:
        self._delay = self.backoff.after(self._delay)
        return self._delay

    def start(self, republish: Callable[[], int]) -> PoolPublisher:
        """Run ``sync`` in a daemon thread until ``close``; a failed write wakes it early.
        With copies found at start-up (``saw``) the first round republishes them."""
        if self._seen:  # stale: the directory may miss copies this process never wrote
            self.failed()

        def loop() -> None:
            wait = self.interval_s
            while True:
                self._wake.wait(wait)
                self._wake.clear()
                if self._stop.is_set():
                    return
                try:
                    wait = self.sync(republish)
                except Exception:  # the loop must outlive a bad round
                    log.exception("directory repair round failed")
                    wait = self.backoff.max_s
        self._thread = threading.Thread(target=loop, name="agentkv-pool-publisher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10.0)
