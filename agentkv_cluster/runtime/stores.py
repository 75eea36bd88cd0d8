"""An engine store on the controller actor: admit, make room, pull the bytes, retry.

``EngineStorer`` turns ``store(metas, spans)`` into pages held in the session's HBM: the
page manager admits them (choosing victims to demote for their room), the transfer worker
runs those demotions, and the HBM actor pulls each admitted page's bytes from the engine.
A page the manager could not place yet (pinned pages fill the HBM, the arena has no page,
a deletion of its key is on its way) is admitted again after a short pause, for at most
``STORE_WAIT_S``; then the whole store is refused as ``RefusedBusy`` and nothing of it
stays. A store that meets its tenant's erasure or its session's close undoes what it
began. The load's half is ``runtime/loads.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow, HbmHandle
from agentkv_cluster.runtime.loads import RefusedBusy
from agentkv_cluster.runtime.mover import RemoteSpan
from agentkv_cluster.runtime.records import (
    PageMeta,
    RefusedNotFound,
    SessionState,
    TenantErased,
    TransferResult,
    UnknownSession,
)
from store.hbm import ArenaFull

STORE_WAIT_S = 30.0  # a store finding no room retries this long, then is refused as busy


@dataclass(frozen=True)
class Stored:
    """What one store call did: the HBM actors that took bytes, and what the request's
    next call checks (``EngineStorer.store``'s ``after``)."""

    hbms: tuple[str, ...]
    opened: int | None  # the session's opening stored into (``SessionState.serial``)
    erasures: int  # the tenant's erasures before the request's first call


class EngineStorer:
    """The store flow over the guarded page manager and the transfer worker. ``check``
    looks at finished moves (True when one found no room); ``hbm_gone`` forgets an HBM
    actor that died under a pull."""

    def __init__(self, controller: Guarded, executor: Executor, hbms: dict[str, HbmHandle],
                 check: Callable[[list[TransferResult]], bool],
                 hbm_gone: Callable[[str], object]) -> None:
        self.controller, self.executor, self.hbms = controller, executor, hbms
        self._check, self._hbm_gone = check, hbm_gone

    def store(self, tenant: str, session: str, metas: list[PageMeta],
              spans: list[RemoteSpan], after: Stored | None = None) -> Stored:
        """Admit pages (making room first), then let the HBM actor pull their bytes; returns
        the HBM actors that took bytes (``store_survival``: the front checks it was one)
        and the session stored into. ``after``: what this request's previous call stored
        (a request of more pages than the front stages at once is several calls); this
        call is refused if that session was closed, or its tenant erased, since."""
        pending = list(range(len(metas)))
        epoch = after.erasures if after else self.controller.table.erasures[tenant]
        serial = after.opened if after else None
        took: set[str] = set()
        deadline = time.monotonic() + STORE_WAIT_S
        while pending:
            try:
                with self.controller.cv:  # the session checked and admitted into at once
                    serial = self._same(tenant, session, serial).serial
                    admitted, demotes = self.controller.admit(
                        tenant, session, [metas[i] for i in pending], time.monotonic())
            except (TenantErased, UnknownSession) as exc:
                if after is not None or self.controller.erased_since(tenant, epoch):
                    raise self._ended(tenant, session, epoch) from None
                if isinstance(exc, TenantErased):
                    raise
                raise RefusedNotFound(str(exc)) from None
            full = self._check(self.executor.run(demotes))  # no room for the victims' copies
            try:
                hbm = self._same(tenant, session, serial).hbm
            except (TenantErased, UnknownSession):  # erased or closed meanwhile: undo
                self.controller.ingested([g for g, needs in admitted if needs], ok=False)
                raise self._ended(tenant, session, epoch) from None
            retry, no_room = [], False
            for i, (gid, needs) in zip(pending, admitted):
                if needs is None:
                    retry.append(i)
                    no_room |= gid != 0  # else not admitted: its key's deletion still runs
                elif needs:
                    ok = False
                    try:
                        self._ingest(hbm, metas[i], spans[i])
                        ok = True
                        took.add(hbm)
                    except ArenaFull:  # the budget had room, the arena not yet: pages
                        retry.append(i)  # moving out free theirs at the drop; admit again
                        no_room = True
                    finally:
                        copies = self.controller.ingested([gid], ok)
                    self._check(self.executor.run(copies))
            pending = retry
            if pending:
                if full or time.monotonic() > deadline:
                    self.controller.events.forget_unstored(tenant, session, [g for g, _ in admitted])
                    raise RefusedBusy(_why_busy(full, no_room))
                self.controller.pause(0.02)  # pinned pages fill the HBM (or arena)
        try:  # closed (or erased) during the pulls: its pages retired, none stored
            self._same(tenant, session, serial)
        except (TenantErased, UnknownSession):
            raise self._ended(tenant, session, epoch) from None
        return Stored(hbms=tuple(sorted(took)), opened=serial, erasures=epoch)

    def _same(self, tenant: str, session: str, serial: int | None) -> SessionState:
        """The session, still the opening numbered ``serial`` (``UnknownSession`` if closed
        since, even where a session of the same name was opened anew)."""
        state = self.controller.table.session(tenant, session)
        if serial is not None and state.serial != serial:
            raise UnknownSession(f"session {session!r} is not open")
        return state

    def _ended(self, tenant: str, session: str, epoch: int) -> Exception:
        """What a store its session outlived answers: the tenant's erasure, or the close."""
        if self.controller.erased_since(tenant, epoch):
            return TenantErased("the tenant was erased during this store")
        return RefusedNotFound(f"session {session!r} closed during this store")

    def _ingest(self, hbm: str, meta: PageMeta, span: RemoteSpan) -> None:
        try:
            self.hbms[hbm].ingest(meta.key, span)
        except ActorGone as exc:
            if not isinstance(exc, ActorSlow):  # a slow one is the watcher's to judge
                self._hbm_gone(hbm)
            raise


def _why_busy(full: bool, no_room: bool) -> str:
    """Why a store is refused: no room in the tiers below, none in HBM, or (neither) a
    deletion of a retired page under one of its keys still runs."""
    if full:
        return "no room for the pages that would make room: a pool's tiers are full"
    if no_room:
        return "HBM is full of pinned pages; release some and retry"
    return ("a page of the same identity, retired when its session closed, is still being "
            "deleted; retry")
