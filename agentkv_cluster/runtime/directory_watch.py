"""The head's watch on the directory: is it up, does it take writes, did it restart.

``DirectoryWatch`` probes the directory every few seconds while it answers; after a
failure it logs at error level and retries with exponential backoff (requests run
local-only meanwhile: ``directory_glue.GuardedDirectory``), and on recovery logs it and
calls ``on_recover``. On Redis (``watch_redis``) a recovery is also a restart seen between
two probes: one that emptied the server (``directory_emptied``: a marker lost its
generation) or one that kept data (its run id changed). A restart that kept data may have
loaded a snapshot older than the last erasures, so the service re-applies them then
(``erasure.ClusterErasure.reapply_directory``). The pools repair their own entries
(``pool_publisher``): the watch does not republish them.

A Redis that answers but refuses writes (out of memory) is not an outage: reads, so
sharing what is published, still work and ``/readyz`` stays ready (its line says so). The
probe asks without writing (``check_writes``); the watch logs the refusal once at error
level (``RefusalLog``) and feeds ``agentkv_directory_refuses_writes``; pools republish
once it ends. ``probe_redis`` is one look; ``probe`` is readiness.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkv_cluster.runtime.actor_watch import answers
from agentkv_cluster.runtime.directory_glue import Backoff, RedisSpec
from agentkv_cluster.runtime.handles import ActorHandle

if TYPE_CHECKING:
    from store.directory.base import WriteRefusal

log = logging.getLogger(__name__)
WATCH_BACKOFF = Backoff()  # 0.5 s, doubling up to 30 s


class DirectoryWatch:
    """The head's watch on the directory: probes it every ``interval_s`` while it answers;
    after a failure logs at error level and retries with ``backoff``; on recovery logs it
    and calls ``on_recover`` if given (retried with ``backoff`` until it succeeds). A
    restart between two probes is a recovery too: ``emptied`` (the server lost its
    entries) or ``restarted`` (it came back with data, maybe an older snapshot's), each
    asked after every probe that reached the directory."""

    def __init__(self, check: Callable[[], tuple[bool, str]], *, on_recover: Callable[[], Any]
                 | None = None, interval_s: float = 5.0, backoff: Backoff = WATCH_BACKOFF,
                 emptied: Callable[[], bool] | None = None,
                 restarted: Callable[[], bool] | None = None) -> None:
        self.check = check
        self.on_recover = on_recover
        self.emptied = emptied  # lost its entries since the last call? (``directory_emptied``)
        self.restarted = restarted  # restarted since the last call? (``ServerRuns``)
        self.interval_s = interval_s
        self.backoff = backoff
        self.up: bool | None = None  # unknown until the first probe
        self.outages = 0
        self.recoveries = 0
        self._delay: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def probe_once(self) -> float:
        """One probe; returns how long to wait before the next one."""
        ok, detail = self.check()
        if ok:
            emptied = self.emptied is not None and self.emptied()
            restarted = self.restarted is not None and self.restarted()
            if self.up and (emptied or restarted):  # no failed probe between
                if emptied:
                    log.error("directory lost its entries since the last probe (restarted "
                              "or flushed)")
                else:
                    log.warning("directory restarted since the last probe; it may have "
                                "loaded an older snapshot")
                self.outages, self.up = self.outages + 1, False
        if ok and self.up is False:
            log.warning("directory reachable again (%s)", detail)
            if not self._recovered():
                return self._backoff()  # call on_recover again after the next delay
            self.recoveries += 1
        if ok:
            self.up, self._delay = True, None
            return self.interval_s
        if self.up is not False:
            self.outages += 1
        self.up = False
        delay = self._backoff()
        log.error("%s; requests run local-only (see docs/operations.md); retrying in %.1f s",
                  detail, delay)
        return delay

    def _backoff(self) -> float:
        self._delay = self.backoff.after(self._delay)
        return self._delay

    def _recovered(self) -> bool:
        if self.on_recover is None:
            return True
        try:
            done = self.on_recover()
        except Exception:  # the pools' own guards may still be backing off: retry later
            log.exception("the directory's recovery step failed; retrying")
            return False
        log.warning("after the directory's recovery: %s", done)
        return True

    def start(self, first_wait_s: float = 0.0) -> DirectoryWatch:
        def loop() -> None:
            wait = first_wait_s
            while not self._stop.wait(wait):
                try:
                    wait = self.probe_once()
                except Exception:  # the watch must outlive a bad probe
                    log.exception("directory probe failed")
                    wait = self.backoff.max_s
        self._thread = threading.Thread(target=loop, name="agentkv-directory-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)


# The watch's marker, shaped like a blinded namespace (never a tenant's: those are keyed hashes)
WATCH_NAMESPACE = "n" + "0" * 24


def watch_redis(spec: RedisSpec, *, on_probe: Callable[[bool], Any] = lambda _ok: None,
                on_refusal: Callable[[WriteRefusal | None], Any] = lambda _why: None,
                on_recover: Callable[[], Any] | None = None,
                retry_max_s: float = 30.0) -> DirectoryWatch:
    """The head's watch on a Redis directory, not started: it probes with ``probe_redis``,
    tells ``on_probe`` whether it answers (the ``agentkv_directory_up`` gauge) and
    ``on_refusal`` why it refuses writes, None if it does not or cannot be reached
    (``agentkv_directory_refuses_writes``), sees a restart between two probes (emptied:
    ``directory_emptied``; with data: a new run id) and calls ``on_recover`` after each
    outage or restart. It does not republish: each pool's repair loop owns its entries."""
    refusals = RefusalLog()
    runs = ServerRuns()

    def check() -> tuple[bool, str]:
        seen = probe_redis(spec, run_id=True)
        on_probe(seen.up)
        on_refusal(seen.refusal)
        if seen.up:
            refusals.seen(seen.refusal, seen.detail)
            runs.saw(seen.run_id)
        return seen.up, seen.detail

    return DirectoryWatch(check, on_recover=on_recover,
                          backoff=Backoff(first_s=0.5, max_s=max(0.5, retry_max_s)),
                          emptied=lambda: directory_emptied(spec), restarted=runs.restarted)


class ServerRuns:
    """Whether the server restarted between two probes: its run id changed (Redis draws a
    new one at every start). An unknown id (INFO not allowed) changes nothing."""

    def __init__(self) -> None:
        self.last: str | None = None
        self._changed = False

    def saw(self, run_id: str | None) -> None:
        if run_id is None:
            return
        if self.last is not None and run_id != self.last:
            self._changed = True
        self.last = run_id

    def restarted(self) -> bool:
        """A restart seen since the last call (once per restart)."""
        changed, self._changed = self._changed, False
        return changed


def directory_emptied(spec: RedisSpec, timeout_s: float = 2.0) -> bool:
    """Whether Redis lost its contents since the last call (a restart without persistence or
    a FLUSHALL, however short): the marker has no generation. Marks it; False if unreachable."""
    from store.directory.base import DirectoryError
    from store.directory.redis_backend import RedisDirectory

    client = RedisDirectory(spec.url, prefix=spec.prefix, socket_timeout_s=timeout_s)
    try:  # a new client each time: its generation floor is 0, so it cannot lift the marker
        emptied = client.current_generation(WATCH_NAMESPACE) == 0
        return emptied and client.open_generation(WATCH_NAMESPACE) > 0
    except DirectoryError:
        return False
    finally:
        client.close()


@dataclass(frozen=True, kw_only=True)
class DirectoryProbe:
    """One look at the Redis directory: does it answer a read, and if so, why it refuses
    writes (None: it accepts them, or it cannot be reached); ``detail`` is one line."""

    up: bool
    refusal: WriteRefusal | None
    detail: str
    run_id: str | None = None  # the server's, where it answered and INFO is allowed


class RefusalLog:
    """Logs a streak of refused writes once: at error level when the directory starts
    refusing writes, at warning level when it accepts them again."""

    def __init__(self) -> None:
        self.refusal: WriteRefusal | None = None

    def seen(self, refusal: WriteRefusal | None, detail: str) -> None:
        if refusal is not None and self.refusal is None:
            log.error("%s; pools keep their copies and publish them once it accepts writes "
                      "(see docs/operations.md)", detail)
        elif refusal is None and self.refusal is not None:
            log.warning("directory accepts writes again")
        self.refusal = refusal


def probe_redis(spec: RedisSpec, timeout_s: float = 2.0, *, run_id: bool = False
                ) -> DirectoryProbe:
    """One real read, then ``check_writes`` (which writes nothing, so a full Redis is not
    filled by its own probe); with ``run_id`` the server's run id too (the watch's, to see
    restarts; readiness does not ask)."""
    from store.directory.base import DirectoryError, WritesRefused
    from store.directory.redis_backend import RedisDirectory

    try:
        client = RedisDirectory(spec.url, spec.prefix, socket_timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - a bad URL is "not ready", with the reason
        return DirectoryProbe(up=False, refusal=None,
                              detail=f"directory: {type(exc).__name__}: {exc}")
    run: str | None = None
    try:
        client.get("readyz", b"readyz")
        run = client.server_run_id() if run_id else None
        client.check_writes()
        return DirectoryProbe(up=True, refusal=None, detail="directory ok", run_id=run)
    except WritesRefused as exc:
        return DirectoryProbe(up=True, refusal=exc.reason, run_id=run,
                              detail=f"directory answers reads but refuses writes: {exc}")
    except DirectoryError as exc:
        return DirectoryProbe(up=False, refusal=None,
                              detail=f"directory unreachable: {type(exc).__name__}: {exc}")
    finally:
        client.close()


def probe(directory: Any, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Readiness: can this process reach the directory? (Redis: ``probe_redis``; one that
    refuses writes is ready, and its line says so.)"""
    if isinstance(directory, RedisSpec):
        seen = probe_redis(directory, timeout_s)
        return seen.up, seen.detail
    if isinstance(directory, ActorHandle):
        ok, line = answers(directory, "directory actor", timeout_s)
        if not ok:
            return ok, line
    return True, "directory ok"


def ready(directory: Any, watch: DirectoryWatch | None, timeout_s: float = 2.0
          ) -> tuple[bool, str]:
    """``/readyz``'s directory part: reachable now (``probe``), and, where a watch runs,
    recovered from its last outage: Redis answering again is not enough until the watch
    has erased again what a snapshot may have brought back of erased tenants (it said
    ready 11 s before that, and the docs say it turns ready after)."""
    ok, line = probe(directory, timeout_s)
    if ok and watch is not None and watch.up is False:
        return False, "directory: reachable again, recovering from the outage"
    return ok, line
