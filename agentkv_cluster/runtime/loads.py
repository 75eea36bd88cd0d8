"""An engine load on the controller actor: wait, pin all or nothing, restore, report.

``EngineLoader`` turns ``load(keys)`` into page reports: it waits (in the guard) until the
pages stop moving, pins them all or none, has the executor run the planned demotions and
restores, retries once when an actor died mid-restore, and reports per page where the
bytes came from and how long the engine waited. Pages with no copy left, or that could not
be brought back, are refused as ``RefusedPageLost`` (the engine re-prefills). ``RoomQueue``
keeps a load waiting for room from starving: once blocked a while, later loads on the same
HBM actor wait for it (a bounded time each). ``PreparedLoads`` is the API front's half:
each prepared load until served, released, expired (``LOAD_TTL_S``) or crowded out
(``MAX_PREPARED_KEYS``), so loads never completed cannot grow the front without bound.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import LOAD_WAIT_S, Guarded, ServiceStopping, StillMoving
from agentkv_cluster.runtime.records import (
    ActionKind,
    LoadPhases,
    LoadReport,
    Outcome,
    RefusedNotFound,
    RequestRefused,
    TenantErased,
    TransferResult,
    UnknownPageKey,
    UnknownSession,
)
from store.types import Codec


class RefusedPageLost(RequestRefused):
    """A load refused through no fault of its caller: pages of it have no copy left (their
    HBM actor died with their only copy), or their restore failed (a later load may find a
    copy). Nothing stays pinned; the engine re-prefills (the API's ``page_lost``). A
    ``RequestRefused``: the handlers of refusals (an erasure, a close) still see it first."""


class RefusedForeign(RequestRefused):
    """A load names a page of the PUBLIC namespace (adopted into the session by a token of
    the tenant that opted in) with a token that did not opt in (the API's ``forbidden``)."""


class RefusedBusy(RequestRefused):
    """Refused for want of room, not for bad input: the HBM is full of pinned pages, or a
    pool had room on no tier for the copies that would make room (the API's ``busy``:
    nothing was changed; retry later, or release pages)."""


AGE_S = 0.2  # a load blocked for room this long goes before later loads on its HBM actors
YIELD_S = 1.0  # at most this long, over one load, does a later load wait for older ones


class RoomQueue:
    """Loads blocked for room, so that none starves. A load waits for room all or nothing,
    so while other loads keep pinning pages on its HBM actor (each a few, one after
    another), a load that needs more room may never see it free, and was refused as busy
    at its deadline while the later loads went on. Once a load has been blocked for
    ``age_s``, a load that began later and needs any of the HBM actors it is short of waits
    until it got its pins or gave up, at most ``yield_s`` over that later load: an engine
    whose own pins hold the older load back (so that they would go only once its next load
    ran) is delayed, not deadlocked. Older loads first among those waiting (thread-safe)."""

    def __init__(self, age_s: float = AGE_S, yield_s: float = YIELD_S) -> None:
        self.age_s, self.yield_s = age_s, yield_s
        self._blocked: dict[int, tuple[float, frozenset[str]]] = {}  # ticket -> since, short
        self._tickets = itertools.count()
        self._cv = threading.Condition()

    def ticket(self) -> int:
        """A load's place in line (its arrival order)."""
        with self._cv:
            return next(self._tickets)

    def blocked(self, ticket: int, short: set[str], now: float) -> None:
        """The load ``ticket`` waits for room on ``short`` (since its first time, ``now``)."""
        with self._cv:
            since = self._blocked.get(ticket, (now, frozenset()))[0]
            self._blocked[ticket] = (since, frozenset(short))

    def done(self, ticket: int) -> None:
        """The load got its pins, or gave up: the loads behind it go on."""
        with self._cv:
            if self._blocked.pop(ticket, None) is not None:
                self._cv.notify_all()

    def ahead(self, ticket: int, hbms: set[str], now: float) -> bool:
        """An older load has been blocked for room on one of ``hbms`` for ``age_s``."""
        with self._cv:
            return any(other < ticket and now - since >= self.age_s and not short.isdisjoint(hbms)
                       for other, (since, short) in self._blocked.items())

    def wait_behind(self, ticket: int, hbms: set[str], until: float) -> float:
        """Wait while ``ahead`` (until the monotonic ``until``); returns the seconds waited
        (0.0: nothing was ahead)."""
        t0 = time.monotonic()
        with self._cv:
            if not self.ahead(ticket, hbms, t0):
                return 0.0
            self._cv.wait_for(lambda: not self.ahead(ticket, hbms, time.monotonic()),
                              max(0.0, until - t0))
        return time.monotonic() - t0


class EngineLoader:
    def __init__(self, controller: Guarded, executor: Executor,
                 check: Callable[[list[TransferResult]], None]) -> None:
        """``check`` looks at failed results for dead actors (the actor removes them)."""
        self.controller = controller
        self.executor = executor
        self.check = check
        self.recompute_tokens: dict[str, int] = {}  # tenant -> tokens of pages lost for good
        self.phases: deque[LoadPhases] = deque(maxlen=10_000)  # the latest loads (stats)
        self.unexported: deque[LoadPhases] = deque(maxlen=10_000)  # not yet in metrics
        self.deadline_s = 45.0  # a load waiting for room or arrivals is refused after this
        self.room = RoomQueue()

    def load(self, tenant: str, session: str, keys: list[bytes], public_read: bool = False
             ) -> list[LoadReport]:
        t0 = time.monotonic()
        try:
            gids = self.controller.table.resolve(tenant, session, keys)
        except (UnknownSession, UnknownPageKey) as exc:
            raise RefusedNotFound(str(exc)) from None
        self._refuse_at_once(tenant, gids, public_read)
        before = {g: self.controller.table.record(g) for g in gids}
        was_resident = {g: r.resident and not r.busy for g, r in before.items()}
        # Wanted for the whole load: background moves of these pages give way (a queued
        # one at once, one waiting for its credit as soon as it looks), a prefetch in
        # flight is promoted to the foreground.
        phases = LoadPhases(pages=len(gids))
        ticket, hbms = self.room.ticket(), {r.hbm for r in before.values()}
        self.controller.demand.want(gids, 1)
        try:
            self.executor.abandon_queued(gids)
            for attempt in range(2):
                by_gid = self._bring_in(gids, phases, ticket, hbms)
                failed = [g for g, r in by_gid.items() if not r.ok]
                if not failed:
                    break
                self.controller.table.unpin(gids, time.monotonic())
                gone = any(by_gid[g].outcome is Outcome.ACTOR_GONE for g in failed)
                if all(by_gid[g].outcome is Outcome.NO_ROOM for g in failed):
                    raise RefusedBusy(f"no room to restore {len(failed)} page(s) (their "
                                      f"copies are kept): {by_gid[failed[0]].error}")
                if attempt or not gone:
                    raise RefusedPageLost(f"{len(failed)} page(s) could not be restored: "
                                          f"{by_gid[failed[0]].error}")
        except (KeyError, RequestRefused):
            if self._closed(tenant, session):
                raise RefusedNotFound(f"session {session!r} was closed during this load"
                                      ) from None
            raise
        finally:
            self.room.done(ticket)
            self.controller.demand.want(gids, -1)
        total = time.monotonic() - t0
        phases.total_s, phases.restored = total, len(by_gid)
        self.phases.append(phases)
        self.unexported.append(phases)
        self.controller.table.hold(tenant, session, gids, time.monotonic())
        if self._closed(tenant, session):  # closed meanwhile: ``hold`` let its pins go
            raise RefusedNotFound(f"session {session!r} was closed during this load")
        return [self._report(g, was_resident[g], by_gid.get(g), total) for g in gids]

    def _closed(self, tenant: str, session: str) -> bool:
        """The session is not open (any more): ``close_session`` ran while a load of it
        did. Its pins went with it; the load answers ``not_found``."""
        return (tenant, session) not in self.controller.table.sessions

    def _refuse_at_once(self, tenant: str, gids: list[int], public_read: bool) -> None:
        """Refuse before anything moves: a PUBLIC page for a token that did not opt in, and
        pages that outsize their HBM actor's whole budget (never pinnable at once, such a
        load held a server thread for its 45 s deadline, then was refused all the same)."""
        need: Counter[str] = Counter()
        with self.controller.cv:
            table = self.controller.manager.table
            for gid in gids:
                rec = table.pages.get(gid)
                if rec is not None:
                    need[rec.hbm] += rec.view.size_bytes
                    if rec.meta.namespace != tenant and not public_read:
                        raise RefusedForeign(f"a page of this load is in the {rec.meta.namespace}"
                                             " namespace, and this token did not opt in to it")
            for hbm, n in need.items():
                budget = table.hbms.get(hbm)
                if budget is not None and n > budget.capacity:
                    raise RequestRefused(
                        f"this load's pages need {n} B of HBM at once, more than the "
                        f"{budget.capacity} B its HBM actor has: load fewer pages at a time")

    def _bring_in(self, gids: list[int], phases: LoadPhases, ticket: int, hbms: set[str]
                  ) -> dict[int, TransferResult]:
        """Pin ``gids`` (on ``hbms``) and restore the missing ones; returns restore results
        by gid. Adds the time of each step to ``phases``."""
        results: list[TransferResult] = []
        deadline = time.monotonic() + self.deadline_s
        behind_until = min(deadline, time.monotonic() + self.room.yield_s)
        waited_for_room = False  # the first plan waits for pages moving out, later ones for room
        while True:
            if time.monotonic() < behind_until:  # an older load starved of room goes first
                phases.blocked_s += self.room.wait_behind(ticket, hbms, behind_until)
            t = time.monotonic()
            demotes, restores, lost, blocked = self.controller.access_settled(gids,
                                                                             time.monotonic)
            planned = time.monotonic()
            if not blocked:  # pinned: the loads behind it go on while it transfers
                self.room.done(ticket)
            if waited_for_room:
                phases.blocked_s += planned - t
            else:
                phases.settle_s += planned - t
            results += self.executor.run(demotes + restores)
            phases.transfer_s += time.monotonic() - planned
            pinned = [g for g in gids if g not in lost and g not in blocked]
            if lost:
                self._count_recompute(lost)
                self.controller.table.unpin(pinned, time.monotonic())
                raise RefusedPageLost(f"PageLost: {len(lost)} page(s) have no copy left; "
                                      "re-prefill them")
            if not blocked:
                # Pages that were on their way in (a prefetch, another load's restore) are
                # pinned as they are; their transfers ran alongside this load's own.
                t = time.monotonic()
                own = {r.action.gid for r in results if r.action.kind is ActionKind.RESTORE}
                try:  # (a page dropped right after the wait, its session closed: KeyError)
                    self.controller.wait_arrived(gids, LOAD_WAIT_S)
                    late = [g for g in gids if g not in own
                            and not self.controller.table.record(g).resident]
                except (TenantErased, UnknownPageKey, ServiceStopping, StillMoving, KeyError):
                    self.controller.table.unpin(gids, time.monotonic())  # no pin stays
                    raise
                phases.arrival_s += time.monotonic() - t
                if not late:
                    break
                # such a transfer failed (its page left HBM): restore those pages here
                self.controller.table.unpin(gids, time.monotonic())
                if time.monotonic() > deadline:  # not the caller's doing: re-prefill them
                    raise RefusedPageLost(f"{len(late)} page(s) did not arrive in HBM: their "
                                          "transfers kept failing until the load's deadline")
                continue
            # All or nothing: holding some pins while waiting for room deadlocks a herd.
            seen = self.controller.table.unpin(pinned, time.monotonic())
            if time.monotonic() > deadline:
                raise RefusedBusy("HBM is full of pinned pages; release some and retry")
            t = time.monotonic()
            short = {self.controller.table.record(g).hbm for g in blocked}
            self.room.blocked(ticket, short, t)
            with self.executor.room_wanted(short):  # prefetches there give their room back
                self.controller.wait_changed(seen, 0.05)  # a pin dropped or a move ended
            phases.blocked_s += time.monotonic() - t
            waited_for_room = True
        self.check(results)
        return {r.action.gid: r for r in results if r.action.kind is ActionKind.RESTORE}

    def _count_recompute(self, lost: list[int]) -> None:
        """The engine re-prefills lost pages: count their tokens per tenant (metrics)."""
        for gid in lost:
            try:
                meta = self.controller.table.record(gid).meta
            except KeyError:
                continue
            self.recompute_tokens[meta.tenant] = \
                self.recompute_tokens.get(meta.tenant, 0) + meta.tokens

    def _report(self, gid: int, hit: bool, result: TransferResult | None, total: float
                ) -> LoadReport:
        """The engine waited ``total`` for every page it did not find in HBM; a prefetch's
        time is hidden only where the load did not wait for it."""
        rec = self.controller.table.record(gid)
        if result is not None:
            source, delay, hidden = result.source, total, 0.0
        else:
            source, delay = "hbm", 0.0 if hit else total
            hidden, rec.hidden_s = max(0.0, rec.hidden_s - delay), 0.0
        return LoadReport(key=rec.meta.key, source=source, delay_s=delay, hidden_s=hidden,
                          exact=rec.resident_codec is Codec.FULL, codec=rec.resident_codec,
                          nbytes=rec.meta.length, hbm=rec.hbm)


LOAD_TTL_S = 60.0  # a prepared load not completed by then is forgotten (its pins went at 30 s)
MAX_PREPARED_KEYS = 1 << 16  # pages in one tenant's prepared loads at once (oldest forgotten)


@dataclass(frozen=True)
class PreparedLoad:
    """A ``prepare_load`` whose pages stay pinned (each in its report's ``hbm``) until the
    engine releases them."""

    tenant: str
    session: str
    keys: list[bytes]
    reports: list[LoadReport]
    at: float = 0.0  # when it was prepared (monotonic)

    def reply_end(self, first: int, budget: int, per_page: int) -> int:
        """Where the pages from ``first`` that fit ``budget`` bytes of one reply end (one
        page at least); ``per_page``: what a page's map costs beside its bytes."""
        end, size = first, 0
        while end < len(self.keys) and (
                end == first or size + self.reports[end].nbytes + per_page <= budget):
            size += self.reports[end].nbytes + per_page
            end += 1
        return end


class PreparedLoads:
    """The front's prepared loads by id (thread-safe)."""

    def __init__(self, ttl_s: float = LOAD_TTL_S, max_keys: int = MAX_PREPARED_KEYS) -> None:
        self.ttl_s, self.max_keys = ttl_s, max_keys
        self._loads: OrderedDict[int, PreparedLoad] = OrderedDict()  # oldest first
        self._keys: Counter[str] = Counter()  # tenant -> pages in its prepared loads
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._loads)

    def add(self, load: PreparedLoad) -> int:
        """Keep ``load``; returns its id. Expired loads go, and the tenant's oldest while
        its loads hold more than ``max_keys`` pages (an empty load counts as one)."""
        with self._lock:
            while self._loads:
                oldest = next(iter(self._loads))
                if load.at - self._loads[oldest].at < self.ttl_s:
                    break
                self._drop(oldest)
            self._keys[load.tenant] += max(1, len(load.keys))
            load_id = next(self._ids)
            self._loads[load_id] = load
            if self._keys[load.tenant] > self.max_keys:
                mine = [i for i, old in self._loads.items() if old.tenant == load.tenant]
                for old_id in mine[:-1]:
                    self._drop(old_id)
                    if self._keys[load.tenant] <= self.max_keys:
                        break
            return load_id

    def get(self, load_id: int, tenant: str, session: str, now: float) -> PreparedLoad | None:
        """The load, if it is this session's and has not expired."""
        with self._lock:
            load = self._loads.get(load_id)
            if load is None or (load.tenant, load.session) != (tenant, session):
                return None
            if now - load.at >= self.ttl_s:
                self._drop(load_id)
                return None
            return load

    def take(self, load_id: int) -> bool:
        """Forget a load (served, or failed); False if it was gone already."""
        with self._lock:
            return self._drop(load_id)

    def released(self, tenant: str, session: str, keys: list[bytes]) -> int:
        """The engine released ``keys``: loads of the session with no page left pinned by
        them go. Returns how many."""
        gone = set(keys)
        with self._lock:
            dead = [i for i, load in self._loads.items()
                    if (load.tenant, load.session) == (tenant, session)
                    and gone.issuperset(load.keys)]
            for load_id in dead:
                self._drop(load_id)
        return len(dead)

    def forget_session(self, tenant: str, session: str) -> int:
        """The session was closed: its loads go (their pins went with it). Returns how
        many."""
        with self._lock:
            dead = [i for i, load in self._loads.items()
                    if (load.tenant, load.session) == (tenant, session)]
            for load_id in dead:
                self._drop(load_id)
        return len(dead)

    def forget_tenant(self, tenant: str) -> int:
        with self._lock:
            dead = [i for i, load in self._loads.items() if load.tenant == tenant]
            for load_id in dead:
                self._drop(load_id)
        return len(dead)

    def _drop(self, load_id: int) -> bool:
        load = self._loads.pop(load_id, None)
        if load is None:
            return False
        self._keys[load.tenant] -= max(1, len(load.keys))
        if self._keys[load.tenant] <= 0:
            del self._keys[load.tenant]
        return True
