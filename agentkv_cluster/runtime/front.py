"""The service behind the wire server: authenticates, validates, stages bytes, calls the controller.

The tenant of every request is the verified token's tenant, never a request field. Page
keys are blinded per tenant (or under the opt-in PUBLIC namespace), so a lookup by another
tenant, or with any identity field changed, cannot match. PUBLIC is read only with a
``public_read`` token and written only with a ``publish`` token of a tenant holding a live
operator grant (``security.publishing``, re-read at most every ``ERASED_RECHECK_S``); every
refusal is audited with its reason. Engine bytes are staged in this process's
NIXL-registered memory; the HBM actor pulls them, never through the Ray object store.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

from agentkv_cluster.api.errors import (
    AccessDenied,
    InvalidArgument,
    NotFound,
    TenantErased,
    Unauthenticated,
)
from agentkv_cluster.api.metrics import ServiceMetrics
from agentkv_cluster.config import FRAME_ENVELOPE_BYTES
from agentkv_cluster.runtime.actor_watch import Liveness, liveness
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow, ControllerHandle, HbmHandle
from agentkv_cluster.runtime.loads import LOAD_TTL_S, PreparedLoad, PreparedLoads
from agentkv_cluster.runtime.mover import Mover, Staged, lease_end
from agentkv_cluster.runtime.page_naming import PageNaming
from agentkv_cluster.runtime.records import LoadReport, PageMeta, UnknownPageKey
from agentkv_cluster.runtime.refusal_codes import REFUSALS, as_api_error
from agentkv_cluster.runtime.request_args import event_fields, identity_tokens, session_name
from agentkv_cluster.runtime.store_survival import store_held
from agentkv_cluster.runtime.tenants import ensure_tenant
from security.blinding import DirectoryBlinder
from security.erasure_marks import ErasureMarks
from security.errors import InvalidToken
from security.keyring import PUBLIC_NAMESPACE, FileKeySource, TenantKeyring
from security.principals import AccessPolicy, DenialHook, Principal, TokenIssuer
from security.publishing import CachedGrants, PublishGrants

T = TypeVar("T")
ERASED_RECHECK_S = 1.0  # marks are re-read this often even if the key directory looks unchanged
STAGE_PAGES = 4  # pages staged in shared memory per controller call
REPLY_PER_PAGE = 256  # a page's map in a reply, beside its bytes


class ErasureGate:
    """What the front knows of erasures, checked on every request (thread-safe): it sees a
    mark as soon as the key directory changes; a token issued before the erasure is void,
    one issued after it is refused (``tenant_erased``, retry) until this service purged
    the old tenant (``ClusterErasure`` calls ``enforced``): the name starts again empty."""

    def __init__(self, keyring: TenantKeyring, keys_dir: str) -> None:
        self.marks = ErasureMarks(keyring, keys_dir, ERASED_RECHECK_S)
        self.on_pending: Callable[[], None] = lambda: None  # the watcher's wake-up
        self._enforced: dict[str, float] = {}  # tenant -> the mark this service enforced
        self._frozen: set[str] = set()  # tenants this service is erasing (``freeze``)
        self._lock = threading.Lock()

    def check(self, principal: Principal) -> None:
        """Refuse a token issued before its tenant's erasure (``Unauthenticated``), and one
        issued after it while the purge here has not finished (``TenantErased``); every
        token of a tenant this service is erasing (``TenantErased``)."""
        tenant = principal.tenant
        with self._lock:
            frozen = tenant in self._frozen
        if frozen:
            raise TenantErased(f"tenant {tenant} is being erased")
        at = self.erased_at(tenant)
        if at is None:
            return
        if principal.issued <= at:
            raise Unauthenticated(f"token predates the erasure of tenant {tenant}")
        with self._lock:
            pending = self._enforced.get(tenant, 0.0) < at
        if pending:
            self.on_pending()
            raise TenantErased(f"tenant {tenant} was erased and its purge is still running "
                               "here; retry in a moment (it then starts again, empty)")

    def erased_at(self, tenant: str) -> float | None:
        """The tenant's latest erasure mark (``security.erasure_marks``)."""
        return self.marks.erased_at(tenant)

    def freeze(self, tenant: str) -> None:
        """This service's erasure of ``tenant`` begins: its calls are refused from now on,
        before its mark is written (the controller's freeze does not see a ``complete_load``,
        which the front serves from HBM), until ``forget``."""
        with self._lock:
            self._frozen.add(tenant)

    def forget(self, tenant: str) -> None:
        """Re-read the marks on the next request (and end ``tenant``'s ``freeze``)."""
        self.marks.invalidate()
        with self._lock:
            self._frozen.discard(tenant)

    def enforced(self, tenant: str, at: float) -> None:
        """This service purged what ``tenant`` left at its erasure of ``at``."""
        with self._lock:
            self._enforced[tenant] = max(at, self._enforced.get(tenant, 0.0))
        self.marks.invalidate()


class ServiceFront:
    """Implements ``agentkv_cluster.api.server.ServiceBackend`` on a deployed topology."""

    def __init__(self, controller: ControllerHandle, hbms: dict[str, HbmHandle], keys_dir: str,
                 issuer: TokenIssuer, metrics: ServiceMetrics, page_bytes: int,
                 on_denied: DenialHook | None = None, max_reply_bytes: int = 64 << 20
                 ) -> None:
        """``max_reply_bytes``: the wire's frame limit; ``complete_load`` pages by it."""
        self.controller, self.hbms, self.keys_dir = controller, hbms, keys_dir
        self.issuer, self.metrics = issuer, metrics
        self.page_bytes, self.max_reply_bytes = page_bytes, max_reply_bytes
        self.keyring = TenantKeyring(FileKeySource(keys_dir))
        self.erasures = ErasureGate(self.keyring, keys_dir)
        self.blinder = DirectoryBlinder(self.keyring)
        # Publishing into PUBLIC needs the operator's grant; a grant or revocation shows
        # within ERASED_RECHECK_S.
        self.grants = CachedGrants(PublishGrants(self.keyring.source), ERASED_RECHECK_S)
        self.access = AccessPolicy(on_denied, self.grants)  # every denial is reported
        self.naming = PageNaming(self.access, self.blinder, keys_dir)
        # Slots are taken per chunk, all at once (``Mover.staged``): no hold-and-wait.
        self.mover = Mover(f"front-{id(self):x}", page_bytes, 8 * STAGE_PAGES)
        self.loads = PreparedLoads()

    def endpoint(self) -> Any:
        return self.mover.endpoint()

    def introduce(self, endpoint: Any) -> None:
        self.mover.introduce(endpoint)

    # -- auth ----------------------------------------------------------------------------------
    def authenticate(self, token: str) -> Principal:
        """The token's principal, if ``ErasureGate.check`` lets it through (a token that
        predates its tenant's erasure can neither read what is left nor provision keys)."""
        try:
            principal = self.issuer.verify(token, time.time())
        except InvalidToken as exc:
            raise Unauthenticated(str(exc)) from None
        self.erasures.check(principal)
        return principal

    def forget_tenant(self, tenant: str) -> int:
        """Tenant erasure in this process: drop its cached keys and blinding secret (a
        tenant of the name gets new ones, matching nothing of the old one), its metric
        series (also for an erasure made by another process, which the watcher enforces)
        and prepared loads (returns how many), and zero the free staging slots."""
        self.keyring.forget(tenant)
        self.metrics.forget_tenant(tenant)
        self.blinder.forget(tenant)
        self.grants.forget()  # its grant to publish went with the erasure
        doomed = self.loads.forget_tenant(tenant)
        self.erasures.forget(tenant)
        self.mover.scrub_free()
        return doomed

    def _call(self, method: Callable[..., T], *args: Any) -> T:
        """``method`` (a ``ControllerHandle`` method) with the controller's refusals as the
        API's errors."""
        try:
            return method(*args)
        except REFUSALS as exc:
            raise as_api_error(exc) from None

    # -- sessions and events -----------------------------------------------------------------
    def open_session(self, principal: Principal, session: str) -> dict[str, Any]:
        session = session_name(session)
        # Read fresh, not cached: a request that authenticated just before an erasure
        # must not provision the tenant's keys again (nor end the erasure's freeze).
        self.erasures.marks.invalidate()
        self.erasures.check(principal)
        ensure_tenant(self.keys_dir, principal.tenant)
        hbm = self._call(self.controller.open_session, principal.tenant, session)
        # Optional, for clients that publish: whether this token may write PUBLIC now.
        publish = principal.can_publish and self.grants.allows(principal.tenant)
        return {"session": session, "tenant": principal.tenant, "hbm": hbm, "publish": publish}

    def close_session(self, principal: Principal, session: str) -> dict[str, Any]:
        """Close the token's tenant's ``session`` (``EventPlanner.close_session``) and forget
        its prepared loads. Idempotent: a session not open answers ``closed`` false."""
        closed = self._call(self.controller.close_session, principal.tenant,
                            session_name(session))
        self.loads.forget_session(principal.tenant, session)
        return {"session": session, **closed.wire()}

    def send_event(self, principal: Principal, session: str, event: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.controller.event, principal.tenant, session, event_fields(event))

    # -- engine side --------------------------------------------------------------------------
    def store_pages(self, principal: Principal, session: str, pages: list[dict[str, Any]]
                    ) -> dict[str, Any]:
        """Stage and store ``pages``; answered once they are held (``store_survival``)."""
        metas, datas = [], []
        for page in pages:
            data = page.get("data")
            if not isinstance(data, bytes) or not 0 < len(data) <= self.page_bytes:
                raise InvalidArgument(f"page data must be 1..{self.page_bytes} bytes")
            meta = self.naming.meta(principal, session, page, "write", len(data))
            # The content hash an audited page leaves in the audit log when it retires.
            metas.append(replace(meta, content_hash=hashlib.blake2b(
                data, digest_size=16, person=b"akv-page").digest()))
            datas.append(data)
        store_held(lambda: self._store_chunks(principal, session, metas, datas),
                   self.controller.ping)
        for meta in metas:
            self.metrics.transfer(principal.tenant, "hbm", meta.length)
        return {"keys": [m.key for m in metas]}

    def _store_chunks(self, principal: Principal, session: str, metas: list[PageMeta],
                      datas: list[bytes]) -> set[str]:
        took: set[str] = set()  # the HBM actors the pages landed in
        stored = None  # each call after the first is refused if the session or the tenant
        for i in range(0, len(metas), STAGE_PAGES):  # that the first stored into has gone
            chunk = datas[i:i + STAGE_PAGES]
            with self._staged(len(chunk)) as staged:
                self.erasures.check(principal)  # its tenant erased while it waited
                for slot, data in zip(staged.slots, chunk):
                    self.mover.slot_view(slot, len(data))[:] = memoryview(data)
                spans = [staged.span(i, len(d)) for i, d in enumerate(chunk)]
                stored = self._call(self.controller.store, principal.tenant, session,
                                    metas[i:i + STAGE_PAGES], spans, stored)
                took.update(stored.hbms)
        return took

    def _staged(self, n: int) -> AbstractContextManager[Staged]:
        """``n`` staging slots, their spans lent for the controller's or an HBM actor's
        answer; held out of use past the lease when none came (``_unanswered``)."""
        return self.mover.staged(n, lease_end(self.controller.timeout_s),
                                 held_on=self._unanswered, timeout_s=60.0)

    def _unanswered(self, exc: BaseException) -> bool:
        """Whether an actor may still move bytes through slots lent to a call that raised
        ``exc``: it did not answer or cannot be reached (``ActorSlow``), or the controller
        died (an HBM actor it asked may still pull). A death the controller relays, or an
        HBM actor's own, leaves nobody to (holding then would only starve the front)."""
        if isinstance(exc, ActorSlow):
            return True
        return isinstance(exc, ActorGone) and liveness(self.controller) is not Liveness.ALIVE

    def lookup_prefix(self, principal: Principal, session: str, identities: list[bytes]
                      ) -> dict[str, Any]:
        metas: list[PageMeta] = []
        refused = ""
        for i, raw in enumerate(identities):
            try:
                metas.append(self.naming.meta(principal, session, {"identity": raw, "page_id": i},
                                              "read", 1))
            except (AccessDenied, InvalidArgument) as exc:
                refused = f"{type(exc).__name__}: {exc}"
                break
        namespaces = [self.blinder.namespace(m.namespace) for m in metas]
        n = self._call(self.controller.lookup, principal.tenant, session, metas,
                       namespaces) if metas else 0
        hit_tokens = sum(m.tokens for m in metas[:n])
        miss_tokens = sum(identity_tokens(raw) for raw in identities[n:])
        self.metrics.lookup(principal.tenant, n, len(identities) - n, hit_tokens, miss_tokens)
        return {"length": n, "keys": [m.key for m in metas[:n]], "refused": refused}

    def prepare_load(self, principal: Principal, session: str, keys: list[bytes]) -> dict[str, Any]:
        try:  # PUBLIC pages in the session: for a token that opted in, or a publisher's
            reports = self._call(self.controller.load, principal.tenant, session, keys,
                                 self.access.may_load_public(principal))
        except AccessDenied:  # a PUBLIC page, and neither: audited
            self.naming.check(principal, PUBLIC_NAMESPACE, "read")
            raise
        for r in reports:
            self.metrics.restore(principal.tenant, r.source, r.delay_s, r.hidden_s)
            if r.source != "hbm":
                self.metrics.transfer(principal.tenant, "hbm", r.nbytes)
        load_id = self.loads.add(PreparedLoad(principal.tenant, session, keys, reports,
                                              at=time.monotonic()))
        return {"load_id": load_id, "pages": [
            {"key": r.key, "source": r.source, "delay_ms": r.delay_s * 1e3,
             "hidden_ms": r.hidden_s * 1e3, "exact": r.exact, "codec": r.codec.name}
            for r in reports]}

    def complete_load(self, principal: Principal, session: str, load_id: int,
                      start: int | None = None) -> dict[str, Any]:
        """The load's pages; with ``start``, those from ``start`` that fit one reply, and
        ``next`` (the first page left, or None once all were served)."""
        load = self.loads.get(load_id, principal.tenant, session, time.monotonic())
        if load is None:
            raise NotFound("unknown load id (completed, released, or prepared over "
                           f"{LOAD_TTL_S:.0f} s ago)")
        n = len(load.keys)
        if start is not None and not 0 <= start <= n:
            raise InvalidArgument(f"start must be 0..{n}")
        first = start or 0
        end = load.reply_end(first, self.max_reply_bytes - FRAME_ENVELOPE_BYTES, REPLY_PER_PAGE)
        if start is None and end < n:  # kept: the caller pages it
            raise InvalidArgument(f"this load's {n} pages do not fit one reply of "
                                  f"{self.max_reply_bytes} bytes: call complete_load with "
                                  "start=0, then with each reply's next")
        if end == n and not self.loads.take(load_id):
            raise NotFound("unknown load id (completed by another call)")
        try:
            pages = self._serve(principal, session, load.keys[first:end],
                                load.reports[first:end])
        except UnknownPageKey:
            self.loads.take(load_id)
            raise NotFound("a page of this load left HBM (its pin was released, timed out "
                           "or revoked for another tenant): prepare the load again") from None
        except ActorGone as exc:  # the HBM actor holding its pins, or the pool of a reference
            self.loads.take(load_id)
            how = "did not answer" if isinstance(exc, ActorSlow) else "is gone"
            raise NotFound(f"an actor serving this load {how} ({exc}): prepare the load "
                           "again (pages with no copy left are refused as page_lost)") from None
        return {"pages": pages} if start is None else \
            {"pages": pages, "next": end if end < n else None}

    def _serve(self, principal: Principal, session: str, keys: list[bytes],
               reports: list[LoadReport]) -> list[dict[str, Any]]:
        """Each page's bytes, ``STAGE_PAGES`` at a time (``_serve_chunk``)."""
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), STAGE_PAGES):
            out += self._serve_chunk(principal, session, keys[i:i + STAGE_PAGES],
                                     reports[i:i + STAGE_PAGES])
        return out

    def _serve_chunk(self, principal: Principal, session: str, keys: list[bytes],
                     reports: list[LoadReport]) -> list[dict[str, Any]]:
        """A lossy working copy is verified against its FULL reference, fetched from the
        pool instead (the verification work of the policy that chose the lossy form,
        reported per page as ``verify_ms``, ``verify_bytes`` and in the restore metrics);
        one with no reference is served as it is (``exact`` false). Every other page comes
        from HBM in one call, its pushes in flight together: the load's pins are held until
        the engine releases them, so a slow ``complete_load`` keeps other loads waiting."""
        with self._staged(len(keys)) as staged:
            slots = staged.slots
            hbm = self.hbms[reports[0].hbm]  # a session's pages are pinned in its HBM actor
            spans = [staged.span(i, r.nbytes) for i, r in enumerate(reports)]
            exact = [bool(r.exact) for r in reports]
            verify = [(0.0, 0)] * len(keys)
            whole = [i for i, r in enumerate(reports) if r.exact]
            served = hbm.start_serve([keys[i] for i in whole], [spans[i] for i in whole]) \
                if whole else None
            try:
                for i, report in enumerate(reports):
                    if report.exact:
                        continue
                    t0 = time.monotonic()
                    exact[i] = self._call(self.controller.serve_exact, principal.tenant,
                                          session, keys[i], spans[i])
                    verify[i] = (time.monotonic() - t0, report.nbytes if exact[i] else 0)
                    self.metrics.verify(principal.tenant, exact[i], verify[i][0])
            except BaseException as exc:  # an ActorSlow of either must reach the slots' hold
                if served is not None:
                    try:
                        served()  # its pushes land in our slots: wait before reuse
                    except ActorSlow as late:  # held either way: say so without a ping
                        if not isinstance(exc, ActorSlow):
                            raise late from exc
                    except Exception:  # noqa: BLE001, S110 - the first error is the one to report
                        pass
                raise
            if served is not None:
                served()
            unverified = [i for i, r in enumerate(reports) if not r.exact and not exact[i]]
            if unverified:
                hbm.serve([keys[i] for i in unverified], [spans[i] for i in unverified])
            return [{"key": key, "data": self.mover.slot_view(slot, r.nbytes).tobytes(),
                     "exact": ok, "verify_ms": v_s * 1e3, "verify_bytes": v_bytes}
                    for key, slot, r, ok, (v_s, v_bytes)
                    in zip(keys, slots, reports, exact, verify)]

    def release(self, principal: Principal, session: str, keys: list[bytes]) -> dict[str, Any]:
        released = self._call(self.controller.release, principal.tenant, session, keys)
        self.loads.released(principal.tenant, session, keys)
        return {"released": released}
