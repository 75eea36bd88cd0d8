"""How actors reach the directory: a Redis spec opened in-process, or the embedded one in an actor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RedisSpec:
    url: str
    prefix: str = "akv"


def open_directory(directory: Any) -> Any:
    """A ``RedisSpec`` becomes a ``RedisDirectory`` in the calling process; handles pass through."""
    if isinstance(directory, RedisSpec):
        from store.directory.redis_backend import RedisDirectory

        return RedisDirectory(directory.url, prefix=directory.prefix)
    return directory


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


def probe(directory: Any, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Readiness: can this process reach the directory? (Redis: one real read.)"""
    from store.directory.base import DirectoryError

    if isinstance(directory, RedisSpec):
        from store.directory.redis_backend import RedisDirectory

        try:
            client = RedisDirectory(directory.url, prefix=directory.prefix,
                                    socket_timeout_s=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a bad URL is "not ready", with the reason
            return False, f"directory: {type(exc).__name__}: {exc}"
        try:
            client.get("readyz", b"readyz")
            return True, "directory ok"
        except DirectoryError as exc:
            return False, f"directory unreachable: {type(exc).__name__}: {exc}"
        finally:
            client.close()
    if hasattr(directory, "alive") and not directory.alive(timeout_s):
        return False, "directory actor unreachable"
    return True, "directory ok"
