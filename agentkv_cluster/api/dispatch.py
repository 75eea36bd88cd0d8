"""What each wire op calls on the ``ServiceBackend`` (on a worker thread), and each
tenant's bounded share of those threads (``ApiServer``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentkv_cluster.api import protocol as p


class ServiceBackend(Protocol):
    """What the server calls; ``principal`` comes from the authenticator."""

    def open_session(self, principal: Any, session: str) -> dict[str, Any]: ...
    def close_session(self, principal: Any, session: str) -> dict[str, Any]: ...
    def send_event(self, principal: Any, session: str, event: dict[str, Any]) -> dict[str, Any]: ...
    def store_pages(self, principal: Any, session: str, pages: list[dict[str, Any]]) -> dict[str, Any]: ...
    def lookup_prefix(self, principal: Any, session: str, identities: list[bytes]) -> dict[str, Any]: ...
    def prepare_load(self, principal: Any, session: str, keys: list[bytes]) -> dict[str, Any]: ...
    def complete_load(self, principal: Any, session: str, load_id: int,
                      start: int | None = None) -> dict[str, Any]: ...
    def release(self, principal: Any, session: str, keys: list[bytes]) -> dict[str, Any]: ...


Authenticator = Callable[[str], Any]  # token -> principal (with .tenant); raises if invalid


def _pages_arg(args: dict[str, Any]) -> list[dict[str, Any]]:
    pages = p.arg(args, "pages", list)
    if len(pages) > 4096 or not all(isinstance(x, dict) for x in pages):
        raise p.ProtocolError(p.ErrorCode.BAD_ARGS, "'pages' must be a list of <= 4096 maps")
    return pages


def dispatch(backend: ServiceBackend, principal: Any, op: str, args: dict[str, Any]) -> Any:
    session = p.arg(args, "session", str)
    if op == "open_session":
        return backend.open_session(principal, session)
    if op == "close_session":
        return backend.close_session(principal, session)
    if op == "event":
        return backend.send_event(principal, session, p.arg(args, "event", dict))
    if op == "store_pages":
        return backend.store_pages(principal, session, _pages_arg(args))
    if op == "lookup_prefix":
        return backend.lookup_prefix(principal, session, p.bytes_list(args, "identities"))
    if op == "prepare_load":
        return backend.prepare_load(principal, session, p.bytes_list(args, "keys", distinct=True))
    if op == "complete_load":
        return backend.complete_load(principal, session, p.arg(args, "load_id", int),
                                     p.arg(args, "start", int, optional=True))
    if op == "release":
        return backend.release(principal, session, p.bytes_list(args, "keys", distinct=True))
    raise p.ProtocolError(p.ErrorCode.UNKNOWN_OP, f"unknown op {op[:64]!r}")


OPS = frozenset({"hello", "open_session", "close_session", "event", "store_pages",
                 "lookup_prefix", "prepare_load", "complete_load", "release"})
# A tenant's calls hold at most ``ApiConfig.tenant_workers`` threads at once; the rest
# wait for a turn without one. Only calls that free what others wait for are outside the
# share (a release must never queue behind the loads waiting for its room; each is quick,
# and a tenant has one call in flight per connection). Calls that cannot wait were outside
# it too, and a tenant's flood of 4,096-identity lookups held every thread (another
# tenant's open_session took 7.7 s).
FREEING_OPS = frozenset({"release", "close_session"})


@dataclass
class _Share:
    slots: asyncio.Semaphore
    users: int = 0  # calls holding or waiting for a slot (the share goes at 0)


class TenantShares:
    """Each tenant's turn at the worker threads (calls outside ``FREEING_OPS``): at most
    ``per_tenant`` of one tenant's run at once, the rest wait without a thread. Used on
    the event loop's thread only."""

    def __init__(self, per_tenant: int) -> None:
        if per_tenant < 1:
            raise ValueError(f"per_tenant must be >= 1, got {per_tenant}")
        self.per_tenant = per_tenant
        self._shares: dict[str | None, _Share] = {}

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str | None) -> AsyncIterator[None]:
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Share(asyncio.Semaphore(self.per_tenant))
        share.users += 1
        try:
            async with share.slots:
                yield
        finally:
            share.users -= 1
            if not share.users:
                del self._shares[tenant]
