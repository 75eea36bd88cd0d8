"""EmbeddedDirectory: the in-process default backend (one lock, plain dicts)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from store.directory.base import (
    ERASED_KEEP,
    DirectoryEntry,
    EntryInUse,
    GenerationRegression,
    InvalidEntry,
    MissingEntry,
    ReadOnlyGeneration,
    RefcountUnderflow,
    UnknownGeneration,
    check_key,
    check_namespace,
)
from store.types import Lookup


@dataclass(slots=True)
class _Namespace:
    generation: int = 0
    sealed: bool = False  # whether the current generation is sealed too
    entries: dict[bytes, DirectoryEntry] = field(default_factory=dict)

    def is_sealed(self, generation: int) -> bool:
        return generation < self.generation or (generation == self.generation and self.sealed)


class EmbeddedDirectory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spaces: dict[str, _Namespace] = {}
        # Namespaces erased on purpose (the newest ERASED_KEEP), as the Redis backend's
        # tombstones: a write racing the erasure is taken back, not left behind.
        self._erased: OrderedDict[str, None] = OrderedDict()

    def _space(self, namespace: str, create: bool = True) -> _Namespace:
        """The namespace's state; reads of an unknown namespace do not create it, nor does
        anything an erased one (a generation opened in it is forgotten, as on Redis)."""
        check_namespace(namespace)
        space = self._spaces.get(namespace)
        if space is None:
            space = _Namespace()
            if create and namespace not in self._erased:
                self._spaces[namespace] = space
        return space

    def put(self, entry: DirectoryEntry) -> None:
        if not isinstance(entry, DirectoryEntry):
            raise InvalidEntry(f"expected a DirectoryEntry, got {type(entry).__name__}")
        with self._lock:
            if entry.tenant_ns in self._erased:
                return  # erased meanwhile: taken back, as on Redis
            space = self._space(entry.tenant_ns)
            _check_writable(space, entry.generation)
            old = space.entries.get(entry.key)
            space.entries[entry.key] = entry if old is None else entry.with_refcount(old.refcount)

    def get(self, namespace: str, key: bytes) -> tuple[Lookup, DirectoryEntry | None]:
        check_key(key)
        with self._lock:
            entry = self._space(namespace, create=False).entries.get(key)
        return (Lookup.HIT, entry) if entry is not None else (Lookup.MISS, None)

    def get_many(
        self, namespace: str, keys: Sequence[bytes]
    ) -> list[tuple[Lookup, DirectoryEntry | None]]:
        for key in keys:
            check_key(key)
        with self._lock:
            entries = self._space(namespace, create=False).entries
            found = [entries.get(k) for k in keys]
        return [(Lookup.HIT, e) if e is not None else (Lookup.MISS, None) for e in found]

    def delete(self, namespace: str, key: bytes) -> Lookup:
        check_key(key)
        with self._lock:
            entries = self._space(namespace).entries
            entry = entries.get(key)
            if entry is None:
                return Lookup.MISS
            if entry.refcount:
                raise EntryInUse(f"{entry.refcount} references remain")
            del entries[key]
            return Lookup.HIT

    def incref(self, namespace: str, key: bytes) -> int:
        return self._adjust(namespace, key, +1)

    def decref(self, namespace: str, key: bytes) -> int:
        return self._adjust(namespace, key, -1)

    def _adjust(self, namespace: str, key: bytes, delta: int) -> int:
        check_key(key)
        with self._lock:
            space = self._space(namespace)
            entry = space.entries.get(key)
            if entry is None:
                raise MissingEntry(f"no entry for key {key.hex()[:16]} in {namespace}")
            if delta > 0 and space.is_sealed(entry.generation):
                raise ReadOnlyGeneration(f"generation {entry.generation} of {namespace} is sealed")
            if entry.refcount + delta < 0:
                raise RefcountUnderflow(f"key {key.hex()[:16]} has no references")
            space.entries[key] = entry.with_refcount(entry.refcount + delta)
            return entry.refcount + delta

    def open_generation(self, namespace: str) -> int:
        with self._lock:
            space = self._space(namespace)
            space.generation += 1
            space.sealed = False
            return space.generation

    def current_generation(self, namespace: str) -> int:
        with self._lock:
            return self._space(namespace, create=False).generation

    def seal_generation(self, namespace: str, generation: int) -> None:
        with self._lock:
            space = self._space(namespace)
            if generation > space.generation or generation < 1:
                raise UnknownGeneration(f"{namespace} has no generation {generation}")
            if generation == space.generation:
                space.sealed = True

    def advance_generation(self, namespace: str, generation: int) -> None:
        with self._lock:
            space = self._space(namespace)
            if generation < space.generation:
                raise GenerationRegression(
                    f"{namespace} is at generation {space.generation}; refusing {generation}"
                )
            if generation > space.generation:
                space.generation, space.sealed = generation, False

    def restore(self, entries: Sequence[DirectoryEntry]) -> None:
        with self._lock:
            entries = [e for e in entries if e.tenant_ns not in self._erased]
            for entry in entries:  # validate all first: nothing changes on a bad batch
                if entry.generation > self._space(entry.tenant_ns).generation:
                    raise UnknownGeneration(
                        f"{entry.tenant_ns} has no generation {entry.generation}"
                    )
            for entry in entries:
                current = self._spaces[entry.tenant_ns].entries
                old = current.get(entry.key)
                if old is None or old.generation < entry.generation:
                    current[entry.key] = replace(entry, refcount=0)

    def reclaimable(self, namespace: str) -> list[DirectoryEntry]:
        with self._lock:
            space = self._space(namespace, create=False)
            found = [
                e
                for e in space.entries.values()
                if e.refcount == 0 and space.is_sealed(e.generation)
            ]
        return sorted(found, key=lambda e: (e.generation, e.key))

    def delete_namespace(self, namespace: str) -> int:
        """Erasure: the namespace's entries (whatever their references) and its generation
        state forgotten, and a tombstone left (later writes into it are dropped); the
        number of entries removed."""
        check_namespace(namespace)
        with self._lock:
            self._erased[namespace] = None
            self._erased.move_to_end(namespace)
            while len(self._erased) > ERASED_KEEP:
                self._erased.popitem(last=False)
            space = self._spaces.pop(namespace, None)
        return 0 if space is None else len(space.entries)

    def close(self) -> None:
        """Nothing to release; present for the contract."""


def _check_writable(space: _Namespace, generation: int) -> None:
    if generation > space.generation:
        raise UnknownGeneration(f"generation {generation} not opened (current {space.generation})")
    if space.is_sealed(generation):
        raise ReadOnlyGeneration(f"generation {generation} is sealed (current {space.generation})")
