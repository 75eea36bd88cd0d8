"""Operator grants to publish into the PUBLIC namespace.

PUBLIC is the one place two tenants share pages, so writing it is not a right of a
tenant's own admin: the operator grants it, per tenant, and can take it back. A grant is
an empty entry ``TENANT.publish.<ms>`` in the tenant key directory (the operator's state,
next to the erasure marks; a mounted read-only Secret carries it the same way), written
and removed by ``agentkv tenant publish``, which records both in the audit log.

A write into PUBLIC needs both a token with the ``publish`` role and a live grant of the
token's tenant. A grant is live while its entry exists and is newer than the tenant's
last erasure: erasing a tenant removes its grants, and a grant older than the erasure
mark is void even where removing it failed, so a tenant created again under the name
starts without the right to publish.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from security.errors import InvalidName, KeyExists
from security.keyring import _ERASED_RE, PUBLIC_NAMESPACE, KeySource, validate_namespace

_GRANT_RE = re.compile(r"(?P<ns>[a-z0-9][a-z0-9_-]*)\.publish\.(?P<ms>\d{13})")


def grant_name(tenant: str, at: float) -> str:
    """The entry of a grant made at ``at`` (ms, rounded down: a grant made in the same
    millisecond as an erasure, rounded up, is older than it and void)."""
    return f"{tenant}.publish.{math.floor(at * 1000):013d}"


def _tenant(tenant: str) -> str:
    validate_namespace(tenant)
    if tenant == PUBLIC_NAMESPACE:
        raise InvalidName("PUBLIC itself is not a tenant that publishes")
    return tenant


@dataclass(frozen=True, kw_only=True)
class Grant:
    tenant: str
    granted_at: float  # seconds (ms resolution)
    erased_at: float | None  # the tenant's last erasure, if any

    @property
    def live(self) -> bool:
        return self.erased_at is None or self.granted_at > self.erased_at


class PublishGrants:
    """Reads and writes grants in a ``KeySource`` (the tenant key directory)."""

    def __init__(self, source: KeySource) -> None:
        self.source = source

    def grant(self, tenant: str, at: float) -> Grant:
        """Let ``tenant`` publish from ``at`` on (a second grant only adds a newer entry)."""
        try:
            self.source.create(grant_name(_tenant(tenant), at), b"")
        except KeyExists:  # the same millisecond: already recorded
            pass
        found = self.grants().get(tenant)
        assert found is not None
        return found

    def revoke(self, tenant: str) -> int:
        """Remove every grant entry of ``tenant``; returns how many there were."""
        _tenant(tenant)
        names = [n for n in self.source.names()
                 if (m := _GRANT_RE.fullmatch(n)) and m["ns"] == tenant]
        return sum(self.source.destroy(n) for n in names)

    def grants(self) -> dict[str, Grant]:
        """Every tenant with a grant entry (live or void), by name."""
        granted: dict[str, float] = {}
        erased: dict[str, float] = {}
        for name in self.source.names():
            m = _GRANT_RE.fullmatch(name)
            if m:
                granted[m["ns"]] = max(granted.get(m["ns"], 0.0), int(m["ms"]) / 1000)
                continue
            m = _ERASED_RE.fullmatch(name)
            if m:
                erased[m["ns"]] = max(erased.get(m["ns"], 0.0), int(m["ms"]) / 1000)
        return {t: Grant(tenant=t, granted_at=at, erased_at=erased.get(t))
                for t, at in sorted(granted.items())}

    def allows(self, tenant: str) -> bool:
        """Whether ``tenant`` holds a live grant now."""
        found = self.grants().get(tenant)
        return found is not None and found.live


class CachedGrants:
    """``PublishGrants.allows`` for the request path: the key directory is listed at most
    once per ``max_age_s`` (a grant or a revocation shows within that time)."""

    def __init__(self, grants: PublishGrants, max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grants = grants
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._live: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def allows(self, tenant: str) -> bool:
        now = self._clock()
        with self._lock:
            if self._read_at is None or now - self._read_at >= self.max_age_s:
                try:
                    table = self.grants.grants()
                except OSError:  # the key directory is unreadable: nobody publishes
                    table = {}
                self._live = frozenset(t for t, g in table.items() if g.live)
                self._read_at = now
            return tenant in self._live

    def forget(self) -> None:
        """Read the grants again on the next check (a tenant was just erased here)."""
        with self._lock:
            self._read_at = None
