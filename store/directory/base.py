"""The generational directory contract: page key -> where the page lives.

Each namespace (a tenant, or a tenant's prefix family) has a current
generation. ``open_generation`` starts the next one and seals every older one:
sealed entries stay readable and releasable, but accept no new entries and no
new references, and are reclaimable once their reference count is zero.
Generations only go up, also across a backend restart (see ``advance_generation``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import ClassVar, Protocol, runtime_checkable

from store.types import Codec, Lookup, Tier

NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # safe inside keys and ACL glob patterns
MAX_KEY_BYTES = 64
MAX_FIELD_CHARS = 256
# Erased namespaces each backend remembers (the newest), so that a write racing a tenant
# erasure is taken back: far more erasures than any writer's view of them outlives.
ERASED_KEEP = 100_000


class DirectoryError(Exception):
    """Base class of directory failures."""


class InvalidEntry(DirectoryError, ValueError):
    """A malformed entry, key or namespace; nothing was changed."""


class ReadOnlyGeneration(DirectoryError):
    """The entry's generation is sealed: no new entries or references."""


class UnknownGeneration(DirectoryError):
    """The generation has not been opened in this namespace."""


class GenerationRegression(DirectoryError):
    """Refused: the change would lower a namespace's generation."""


class EntryInUse(DirectoryError):
    """The entry still has references; it cannot be deleted."""


class RefcountUnderflow(DirectoryError):
    """``decref`` on an entry whose reference count is already zero."""


class MissingEntry(DirectoryError):
    """No entry under this key (for operations where absence is an error, not a MISS)."""


class DirectoryUnavailable(DirectoryError):
    """The backing service cannot be reached."""


class WriteRefusal(Enum):
    """Why the backing service refuses every write while it still answers reads."""

    OUT_OF_MEMORY = "out_of_memory"  # Redis at ``maxmemory`` with nothing it may evict
    READ_ONLY_REPLICA = "read_only_replica"  # ``READONLY``: a replica (a primary demoted)
    PERSISTENCE_FAILING = "persistence_failing"  # ``MISCONF``: its RDB or AOF writes fail


class WritesRefused(DirectoryError):
    """The backing service refuses every write for ``reason`` but still answers reads;
    nothing was changed. Writers keep their copies and publish them once it accepts
    writes again. One subclass per reason."""

    reason: ClassVar[WriteRefusal]


class DirectoryFull(WritesRefused):
    """The backing service refuses writes for want of memory (Redis at ``maxmemory`` under
    ``noeviction``, or with no key its policy may evict); nothing was changed. Reads and
    deletions still work: writers keep their copies and publish them once it accepts
    writes again."""

    reason = WriteRefusal.OUT_OF_MEMORY


class ReadOnlyReplica(WritesRefused):
    """The server is a read-only replica (Redis ``READONLY``): the directory's URL names a
    replica, or its primary was demoted in a failover and the client has not followed.
    Reads answer from the replica's copy; every write, deletions included, is refused."""

    reason = WriteRefusal.READ_ONLY_REPLICA


class PersistenceFailing(WritesRefused):
    """The server stopped accepting writes because it cannot persist them (Redis
    ``MISCONF``: an RDB snapshot failed under ``stop-writes-on-bgsave-error yes``, or AOF
    writes fail). Reads answer; every write, deletions included, is refused until a
    snapshot succeeds again."""

    reason = WriteRefusal.PERSISTENCE_FAILING


class DirectoryAccessDenied(DirectoryError):
    """The backing service refused the credentials for this namespace (ACL)."""


class CredentialsRefused(DirectoryAccessDenied, DirectoryUnavailable):
    """The backing service refused this client's credentials (a wrong password, a disabled
    user): access is denied, and the directory unusable until they are fixed (guarded
    callers run local-only meanwhile, as in an outage)."""


@dataclass(frozen=True, kw_only=True)
class DirectoryEntry:
    key: bytes  # opaque (blinded) page identity digest
    tenant_ns: str
    tier: Tier
    node: str
    location: str  # shard/slot inside the node, e.g. "nvme0:3:8192" or "pool:17"
    codec: Codec
    size_bucket: int
    generation: int
    refcount: int = 0

    def __post_init__(self) -> None:
        check_key(self.key)
        check_namespace(self.tenant_ns)
        if not isinstance(self.tier, Tier) or not isinstance(self.codec, Codec):
            raise InvalidEntry("tier must be a Tier and codec a Codec")
        for name in ("node", "location"):
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value) <= MAX_FIELD_CHARS:
                raise InvalidEntry(f"{name} must be a 1..{MAX_FIELD_CHARS} character string")
        for name, low in (("size_bucket", 0), ("generation", 1), ("refcount", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidEntry(f"{name} must be an int >= {low}, got {value!r}")

    def with_refcount(self, refcount: int) -> DirectoryEntry:
        return replace(self, refcount=refcount)


def check_namespace(namespace: str) -> None:
    if not isinstance(namespace, str) or not NAMESPACE_RE.match(namespace):
        raise InvalidEntry(f"namespace must match {NAMESPACE_RE.pattern}, got {namespace!r}")


def check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise InvalidEntry(f"key must be 1..{MAX_KEY_BYTES} bytes")


@runtime_checkable
class DirectoryBackend(Protocol):
    def put(self, entry: DirectoryEntry) -> None:
        """Insert or update (location, tier, codec...) in the namespace's current, unsealed
        generation. An update keeps the stored refcount; an insert takes ``entry.refcount``."""

    def get(self, namespace: str, key: bytes) -> tuple[Lookup, DirectoryEntry | None]: ...

    def get_many(
        self, namespace: str, keys: Sequence[bytes]
    ) -> list[tuple[Lookup, DirectoryEntry | None]]: ...

    def delete(self, namespace: str, key: bytes) -> Lookup:
        """HIT when removed, MISS when absent; EntryInUse while references remain."""

    def incref(self, namespace: str, key: bytes) -> int:
        """The new count. MissingEntry if absent; ReadOnlyGeneration if its generation is sealed."""

    def decref(self, namespace: str, key: bytes) -> int:
        """The new count. MissingEntry if absent; RefcountUnderflow at zero."""

    def open_generation(self, namespace: str) -> int: ...

    def current_generation(self, namespace: str) -> int:
        """0 when no generation has been opened."""

    def seal_generation(self, namespace: str, generation: int) -> None: ...

    def advance_generation(self, namespace: str, generation: int) -> None:
        """Raise the current generation to ``generation`` (repopulation after a restart);
        GenerationRegression if it is lower than the current one."""

    def restore(self, entries: Sequence[DirectoryEntry]) -> None:
        """Re-insert entries found on the tiers after a restart, in any generation up to
        the current one (sealed ones included); refcounts start at zero."""

    def reclaimable(self, namespace: str) -> list[DirectoryEntry]:
        """Entries of sealed generations with no references, oldest generation first."""

    def close(self) -> None: ...


@runtime_checkable
class ReportsLostWrites(Protocol):
    """A backend whose service can lose writes it acknowledged (``RedisDirectory``: a
    restart from an older snapshot, a flush). The embedded directory loses nothing while
    it lives and has no such method; callers look for it with ``getattr``."""

    def lost_writes(self) -> list[str]:
        """The namespaces in which writes this client made are gone since the last call."""


@runtime_checkable
class DeletesNamespaces(Protocol):
    """A backend that drops a whole namespace at once (tenant erasure): every entry
    whatever its references, and the namespace's own bookkeeping (generations, write
    counts). Callers look for it with ``getattr``; a backend without it is erased entry
    by entry with ``delete``."""

    def delete_namespace(self, namespace: str) -> int:
        """Nothing of ``namespace`` is left in the backend; the number of entries removed."""
