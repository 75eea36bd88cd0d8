"""How actors reach the directory: a Redis spec opened in-process, or the embedded one in an actor.

While Redis is unreachable the service runs **local-only** (docs/operations.md, "When the
directory is unreachable"): every process's ``GuardedDirectory`` answers reads with MISS
(prefix lookups find only pages this service already tracks; the engine recomputes the
rest), refuses writes with ``DirectoryUnavailable`` (pools keep their copies and publish
them later), and, between attempts, fails fast instead of waiting on a socket. The head's
``DirectoryWatch`` (``watch_redis``) logs the outage at error level, retries with
exponential backoff, and logs the recovery and a restart that emptied Redis between two
probes. The repair has one owner, each pool (``pool_publisher``): after a write of its
failed, a loss of writes Redis had acknowledged, or its own restart, it republishes once
the directory answers. A watch given ``on_recover`` republishes every pool as well, which
doubles the directory's writes after a restart; ``watch_redis`` gives it none.

A Redis that answers but refuses writes (out of memory) is not an outage: reads, so
sharing what is published, still work and ``/readyz`` stays ready (its line says so). The
head's probe asks without writing (``check_writes``); the watch logs the refusal once at
error level and feeds ``agentkv_directory_refuses_writes``; pools republish once it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from store.types import Lookup

if TYPE_CHECKING:
    from agentkv_cluster.runtime.handles import PoolHandle
    from agentkv_cluster.runtime.records import PageMeta, PoolHolding
    from store.directory.base import WriteRefusal

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Exponential backoff: ``first_s``, doubling, capped at ``max_s``."""

    first_s: float = 0.5
    max_s: float = 30.0

    def after(self, delay_s: float | None) -> float:
        """The delay that follows ``delay_s`` (None: the first failure)."""
        return self.first_s if delay_s is None else min(self.max_s, 2 * delay_s)


@dataclass(frozen=True, kw_only=True)
class RedisSpec:
    url: str
    prefix: str = "akv"


def open_directory(directory: Any) -> Any:
    """A ``RedisSpec`` becomes a guarded ``RedisDirectory`` in this process; handles pass."""
    if isinstance(directory, RedisSpec):
        from store.directory.redis_backend import RedisDirectory

        return GuardedDirectory(RedisDirectory(directory.url, prefix=directory.prefix,
                                               socket_timeout_s=2.0), GUARD_BACKOFF)
    return directory


# Requests see at most one failed attempt per delay and process; the head's watch does the
# logging that operators read, on its own (longer, configurable) schedule.
GUARD_BACKOFF = Backoff(first_s=0.5, max_s=5.0)


class GuardedDirectory:
    """A directory backend in local-only mode while its service is unreachable.

    Reads (``get``, ``get_many``) answer MISS during an outage; every other call raises
    ``DirectoryUnavailable``. After a failure the backend is not tried again before the
    backoff delay has passed (0.5 s, doubling up to 5 s in the actors), so a request never waits on a
    dead socket more than once per delay. Each failed attempt is logged at error level and
    the recovery at warning level."""

    READS = frozenset({"get", "get_many"})

    def __init__(self, inner: Any, backoff: Backoff = Backoff(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.backoff = backoff
        self.clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._delay: float | None = None
        self._next_try = 0.0
        self.failures = 0  # failed attempts since start (tests, stats)

    @property
    def available(self) -> bool:
        return self._down_since is None

    def _call(self, name: str, *args: Any) -> Any:
        from store.directory.base import DirectoryUnavailable

        with self._lock:
            now = self.clock()
            if self._down_since is not None and now < self._next_try:
                waited = now - self._down_since
                raise DirectoryUnavailable(f"directory unreachable for {waited:.1f} s; next "
                                           f"attempt in {self._next_try - now:.1f} s")
        try:
            result = getattr(self.inner, name)(*args)
        except DirectoryUnavailable as exc:
            self._failed(exc)
            raise
        if self._down_since is not None:
            self._recovered()
        return result

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            now = self.clock()
            if self._down_since is None:
                self._down_since = now
            self._delay = self.backoff.after(self._delay)
            self._next_try = now + self._delay
            self.failures += 1
            down = now - self._down_since
        log.error("directory unreachable for %.1f s (%s); running local-only, next attempt in "
                  "%.1f s", down, exc, self._delay)

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            down = self.clock() - self._down_since
            self._down_since, self._delay, self._next_try = None, None, 0.0
        log.warning("directory reachable again after %.1f s", down)

    def get(self, namespace: str, key: bytes) -> Any:
        return self.get_many(namespace, [key])[0]

    def get_many(self, namespace: str, keys: Sequence[bytes]) -> Any:
        from store.directory.base import DirectoryUnavailable
        from store.types import Lookup

        try:
            return self._call("get_many", namespace, keys)
        except DirectoryUnavailable:
            return [(Lookup.MISS, None) for _ in keys]  # local-only: nothing found elsewhere

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not callable(getattr(self.inner, name, None)):
            raise AttributeError(name)
        return lambda *args: self._call(name, *args)


class DirectoryWatch:
    """The head's watch on the directory: probes it every ``interval_s`` while it answers;
    after a failure logs at error level and retries with ``backoff``; on recovery logs it
    and calls ``on_recover`` if given (retried with ``backoff`` until it succeeds)."""

    def __init__(self, check: Callable[[], tuple[bool, str]], *, on_recover: Callable[[], Any]
                 | None = None, interval_s: float = 5.0, backoff: Backoff = Backoff(),
                 emptied: Callable[[], bool] | None = None) -> None:
        self.check = check
        self.on_recover = on_recover
        self.emptied = emptied  # lost its entries since the last call? (``directory_emptied``)
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
        if ok and self.emptied is not None and self.emptied() and self.up:  # no failed probe
            log.error("directory lost its entries since the last probe (restarted or flushed)")
            self.outages, self.up = self.outages + 1, False
        if ok and self.up is False:
            log.warning("directory reachable again (%s)", detail)
            if not self._republish():
                return self._backoff()  # try the republish again after the next delay
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

    def _republish(self) -> bool:
        if self.on_recover is None:
            return True
        try:
            n = self.on_recover()
        except Exception:  # the pools' own guards may still be backing off: retry later
            log.exception("republishing directory entries failed; retrying")
            return False
        log.warning("republished %s directory entries", n)
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


class DirectoryShell:
    """The embedded directory hosted in one actor so every pool sees the same one."""

    def __init__(self) -> None:
        from store.directory import EmbeddedDirectory

        self.inner = EmbeddedDirectory()

    def ping(self) -> str:
        return "directory"

    def put(self, entry: Any) -> None:
        self.inner.put(entry)

    def get(self, namespace: str, key: bytes) -> Any:
        return self.inner.get(namespace, key)

    def get_many(self, namespace: str, keys: list[bytes]) -> Any:
        return self.inner.get_many(namespace, keys)

    def delete(self, namespace: str, key: bytes) -> Any:
        return self.inner.delete(namespace, key)

    def open_generation(self, namespace: str) -> int:
        return self.inner.open_generation(namespace)

    def current_generation(self, namespace: str) -> int:
        return self.inner.current_generation(namespace)

    def advance_generation(self, namespace: str, generation: int) -> None:
        self.inner.advance_generation(namespace, generation)

    def restore(self, entries: list[Any]) -> None:
        self.inner.restore(entries)

    def delete_namespace(self, namespace: str) -> int:
        return self.inner.delete_namespace(namespace)


def held_elsewhere(directory: Any, pools: dict[str, PoolHandle], metas: Sequence[PageMeta],
                   namespaces: Sequence[str], first: int = 0
                   ) -> dict[int, tuple[str, PoolHolding]]:
    """Cross-node prefix sharing: for each page of ``metas`` (numbered from ``first``) that
    the directory places on one of ``pools`` and that pool still holds, the pool's name and
    what it holds. One directory read per namespace and one ``holds_many`` per pool."""
    if directory is None:
        return {}
    by_ns: dict[str, list[int]] = {}
    for i, ns in enumerate(namespaces):
        by_ns.setdefault(ns, []).append(i)
    by_node: dict[str, list[int]] = {}
    for ns, idx in by_ns.items():
        for i, (lookup, entry) in zip(idx, directory.get_many(ns, [metas[i].key for i in idx])):
            if lookup is Lookup.HIT and entry.node in pools:
                by_node.setdefault(entry.node, []).append(i)
    out: dict[int, tuple[str, PoolHolding]] = {}
    for node, idx in by_node.items():
        held = pools[node].holds_many([metas[i].key for i in idx])
        out.update((first + i, (node, h)) for i, h in zip(idx, held) if h is not None)
    return out


# The watch's marker, shaped like a blinded namespace (never a tenant's: those are keyed hashes)
WATCH_NAMESPACE = "n" + "0" * 24


def watch_redis(spec: RedisSpec, *, on_probe: Callable[[bool], Any] = lambda _ok: None,
                on_refusal: Callable[[WriteRefusal | None], Any] = lambda _why: None,
                retry_max_s: float = 30.0) -> DirectoryWatch:
    """The head's watch on a Redis directory, not started: it probes with ``probe_redis``,
    tells ``on_probe`` whether it answers (the ``agentkv_directory_up`` gauge) and
    ``on_refusal`` why it refuses writes, None if it does not or cannot be reached
    (``agentkv_directory_refuses_writes``), and sees an empty restart between two probes
    (``directory_emptied``). It logs; it does not republish: each pool's repair loop owns
    its entries (module doc)."""
    refusals = RefusalLog()

    def check() -> tuple[bool, str]:
        seen = probe_redis(spec)
        on_probe(seen.up)
        on_refusal(seen.refusal)
        if seen.up:
            refusals.seen(seen.refusal, seen.detail)
        return seen.up, seen.detail

    return DirectoryWatch(check, backoff=Backoff(first_s=0.5, max_s=max(0.5, retry_max_s)),
                          emptied=lambda: directory_emptied(spec))


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


def probe_redis(spec: RedisSpec, timeout_s: float = 2.0) -> DirectoryProbe:
    """One real read, then ``check_writes`` (which writes nothing, so a full Redis is not
    filled by its own probe)."""
    from store.directory.base import DirectoryError, WritesRefused
    from store.directory.redis_backend import RedisDirectory

    try:
        client = RedisDirectory(spec.url, spec.prefix, socket_timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - a bad URL is "not ready", with the reason
        return DirectoryProbe(up=False, refusal=None,
                              detail=f"directory: {type(exc).__name__}: {exc}")
    try:
        client.get("readyz", b"readyz")
        client.check_writes()
        return DirectoryProbe(up=True, refusal=None, detail="directory ok")
    except WritesRefused as exc:
        return DirectoryProbe(up=True, refusal=exc.reason,
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
    if hasattr(directory, "alive") and not directory.alive(timeout_s):
        return False, "directory actor unreachable"
    return True, "directory ok"
