"""How actors reach the directory: a Redis spec opened in-process, or the embedded one in an actor.

While Redis is unreachable the service runs **local-only** (docs/operations.md, "When the
directory is unreachable"): every process's ``GuardedDirectory`` answers reads with MISS
(prefix lookups find only pages this service already tracks; the engine recomputes the
rest), refuses writes with ``DirectoryUnavailable`` (pools keep their copies and publish
them later), and, between attempts, fails fast instead of waiting on a socket. The head's
watch on the directory (outages, restarts, refused writes) is ``directory_watch``. The
repair has one owner, each pool (``pool_publisher``): after a write of its failed, a loss
of writes Redis had acknowledged, or its own restart, it republishes once the directory
answers.
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
