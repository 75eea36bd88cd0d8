"""The scheduler-process half of the embedded backend, and what both halves share: the
namespace rule for block identities and callers from verified service tokens."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from agentkv_cluster.engines.vllm.backend import (
    PUBLIC_NAMESPACE,
    BackendUnavailable,
    Caller,
    CallerRefused,
)
from agentkv_cluster.engines.vllm.hints import HintEvent
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.erasure_marks import ErasureMarks
from security.errors import InvalidToken
from security.keyring import FileKeySource, TenantKeyring
from security.principals import TokenIssuer


def check_access(caller: Caller, identity: PageIdentity, write: bool) -> None:
    """The namespace rule of `security.principals.AccessPolicy`, for block identities."""
    ns = identity.tenant
    if ns == caller.tenant:
        return
    if ns == PUBLIC_NAMESPACE and (caller.can_publish if write else caller.public_read):
        return
    raise CallerRefused(f"{caller.tenant} may not {'write' if write else 'read'} {ns!r:.60}")


class TenantErasures:
    """Tenant erasures as the embedded backend enforces them, read from the service's key
    directory (``keys_dir``): a request whose token was issued before its tenant's
    erasure is refused, in both processes, and the worker drops and zeroes the tenant's
    blocks (``newly_erased``)."""

    def __init__(self, keys_dir: str) -> None:
        self.marks = ErasureMarks(TenantKeyring(FileKeySource(keys_dir)), keys_dir)
        self._seen = dict(self.marks.all())  # erased before this engine: nothing of theirs

    def check(self, caller: Caller) -> None:
        at = self.marks.erased_at(caller.tenant)
        if at is not None and caller.issued <= at:
            raise CallerRefused(f"tenant {caller.tenant} was erased after this request's "
                                "token was issued")

    def newly_erased(self) -> list[str]:
        """The tenants erased since the last call."""
        out = []
        for tenant, at in self.marks.all().items():
            if at > self._seen.get(tenant, 0.0):
                self._seen[tenant] = at
                out.append(tenant)
        return out


class TokenResolver:
    """Callers from service tokens, verified with the service's secret (and, given the
    service's key directory, refused once their tenant was erased)."""

    def __init__(self, secret: bytes | None, default_tenant: str | None,
                 erasures: TenantErasures | None = None) -> None:
        self._issuer = TokenIssuer(secret) if secret else None
        self.default_tenant = default_tenant
        self.erasures = erasures

    def resolve(self, token: str | None, session: str | None) -> Caller:
        caller = self._resolve(token, session)
        if self.erasures is not None:
            self.erasures.check(caller)
        return caller

    def _resolve(self, token: str | None, session: str | None) -> Caller:
        if token is None:
            if self.default_tenant is None:
                raise CallerRefused("this engine needs an AgentKV token in the hints")
            tenant = self.default_tenant
            return Caller(tenant=tenant, session=session or f"{tenant}-default",
                          issued=time.time())
        if self._issuer is None:
            raise CallerRefused("this engine has no token secret; tokens cannot be verified")
        try:
            p = self._issuer.verify(token, time.time())
        except InvalidToken as exc:
            raise CallerRefused(f"invalid AgentKV token: {exc}") from None
        return Caller(tenant=p.tenant, session=session or f"{p.tenant}-default", token=token,
                      public_read=p.public_read, is_admin=p.is_admin, issued=p.issued,
                      can_publish=bool(getattr(p, "can_publish", p.is_admin)))


class EmbeddedDirectory:
    """The scheduler-side half of the embedded backend.

    vLLM runs the scheduler and the worker in different processes, and the store lives
    with the worker (it holds the bytes). The scheduler keeps a mirror of the digests
    held: blocks are added when their save is planned and removed when the worker reports
    them dropped (evicted, retired, failed). A lookup that races an eviction loads a
    block that is gone: the worker reports it and vLLM recomputes it. Events are queued
    here and carried to the store in the next step's metadata.
    """

    name = "embedded"

    def __init__(self, resolver: TokenResolver) -> None:
        self._resolver = resolver
        self._held: set[bytes] = set()
        self._events: list[tuple[Caller, HintEvent]] = []
        self._lock = threading.Lock()

    def resolve(self, token: str | None, session: str | None) -> Caller:
        return self._resolver.resolve(token, session)

    def lookup(self, caller: Caller, identities: Sequence[PageIdentity]) -> int:
        n = 0
        with self._lock:
            for ident in identities:
                check_access(caller, ident, write=False)
                if ident.digest() not in self._held:
                    break
                n += 1
        return n

    def contains(self, caller: Caller, identity: PageIdentity) -> bool:
        check_access(caller, identity, write=False)
        return identity.digest() in self._held

    def expect(self, identity: PageIdentity) -> None:
        with self._lock:
            self._held.add(identity.digest())

    def forget(self, digests: set[bytes]) -> None:
        with self._lock:
            self._held -= digests

    def event(self, caller: Caller, event: HintEvent) -> None:
        with self._lock:
            self._events.append((caller, event))

    def take_events(self) -> list[tuple[Caller, HintEvent]]:
        with self._lock:
            events, self._events = self._events, []
            return events

    def get(self, caller: Caller, identity: PageIdentity) -> bytes | None:
        raise BackendUnavailable("block bytes live in the worker process")

    def put(self, caller: Caller, identity: PageIdentity, data: bytes) -> None:
        raise BackendUnavailable("block bytes live in the worker process")

    def close(self) -> None:
        return None
