"""The controller's bookkeeping: a thin loop around the pure lifecycle and policy objects.

``Controller`` holds no Ray and does no I/O. It turns engine calls and orchestrator
events into ``Action`` lists (demote, restore, delete) using the event graph, one
eviction policy per HBM actor and a ``Strategy`` (LRU baseline or AgentKV); the
executor carries the actions out and reports back with ``finished``. Time is
passed in. One lock guards the state because the controller actor is threaded.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType
from agentkv_cluster.policy.base import PageView
from agentkv_cluster.runtime.controller_events import EventScheduling
from agentkv_cluster.runtime.controller_loads import EngineLoads
from agentkv_cluster.runtime.controller_state import HbmBudget, HbmFull, SessionState
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    PageMeta,
    PageRecord,
    TenantErased,
    TenantForgotten,
    UnknownSession,
)
from agentkv_cluster.runtime.strategies import Strategy
from store.types import Codec, Tier


class Controller(EngineLoads, EventScheduling):
    """Bookkeeping for every page, session and HBM actor of one cluster."""

    def __init__(self, strategy: Strategy, page_bytes: int = 0) -> None:
        self.strategy = strategy
        # The HBM budget counts whole arena pages (0: plain bytes): many tiny pages fill
        # an arena long before their bytes add up, so bytes alone would overcommit it.
        self.page_bytes = page_bytes
        self.graph = EventGraph()
        self.pages: dict[int, PageRecord] = {}
        self.by_key: dict[tuple[bytes, str], int] = {}  # (key, hbm) -> gid
        self.by_pid: dict[tuple[str, str, int], int] = {}
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self.hbms: dict[str, HbmBudget] = {}
        self._scheduled: list[tuple[float, int, Action]] = []
        self._seq = itertools.count()
        self._gids = itertools.count(1)
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)  # notified whenever a page stops being busy
        self.changes = 0  # bumped with every notification of ``idle`` (see wait_changed)
        self.stats = {"events": 0, "demotes": 0, "restores": 0, "prefetches": 0, "lost": 0}
        self._wanted: Counter[int] = Counter()  # gids an engine load is waiting for
        self._recalled: set[int] = set()  # gids whose prefetch is due while still moving out
        # Pages of sessions whose tool has returned, until the engine loads them (or the
        # next tool starts): the load is imminent, so background moves of them give way.
        self._returning: set[int] = set()
        self._victims: dict[int, list[int]] = {}  # restore gid -> gids demoted for its room
        self.erasing: set[str] = set()  # tenants being erased: every call of theirs fails
        self.erasures: Counter[str] = Counter()  # erasures done per tenant (loads check it)

    # -- topology -------------------------------------------------------------------------
    def add_hbm(self, name: str, capacity: int) -> None:
        with self.lock:
            self.hbms[name] = HbmBudget(capacity=capacity, policy=self.strategy.new_policy(capacity))

    def remove_hbm(self, name: str) -> list[int]:
        """An HBM actor died: only its HBM copies are gone. Returns gids with no copy left."""
        with self.lock:
            self.hbms.pop(name, None)
            lost = []
            for state in self.sessions.values():
                if state.hbm == name and self.hbms:  # else: parked until an HBM actor joins
                    state.hbm = self._least_loaded()
                    self.hbms[state.hbm].sessions += 1
            for rec in list(self.pages.values()):
                if rec.hbm != name:
                    continue
                rec.resident, rec.busy, rec.pins = False, False, 0
                rec.view.pinned = False
                state = self.sessions.get((rec.meta.tenant, rec.meta.session))
                self.by_key.pop((rec.meta.key, name), None)
                if state is not None:
                    rec.hbm = state.hbm
                    self.by_key.setdefault((rec.meta.key, rec.hbm), rec.gid)
                if not rec.copies:
                    lost.append(rec.gid)
            self.stats["lost"] += len(lost)
            self._changed()
            return lost

    def _least_loaded(self) -> str:
        if not self.hbms:
            raise HbmFull("no HBM actor is alive")
        return min(self.hbms, key=lambda n: (self.hbms[n].sessions, n))

    def open_session(self, tenant: str, session: str) -> str:
        with self.lock:
            self._not_erasing(tenant)
            state = self.sessions.get((tenant, session))
            if state is None:
                state = SessionState(hbm=self._least_loaded())
                self.sessions[(tenant, session)] = state
                self.hbms[state.hbm].sessions += 1
            return state.hbm

    def hbm_of(self, tenant: str, session: str) -> str:
        """The HBM actor a session is placed on (``UnknownSession`` if it is not open)."""
        with self.lock:
            return self._session(tenant, session).hbm

    def _not_erasing(self, tenant: str) -> None:
        if tenant in self.erasing:
            raise TenantErased("the tenant is being erased")

    def _session(self, tenant: str, session: str) -> SessionState:
        self._not_erasing(tenant)
        state = self.sessions.get((tenant, session))
        if state is None:
            raise UnknownSession(f"session {session!r} is not open")
        return state

    # -- engine side -------------------------------------------------------------------------
    def admit(self, owner: str, session: str, metas: list[PageMeta], now: float,
              copies: dict[bytes, dict[Codec, Tier]] | None = None, pool: str = ""
              ) -> tuple[list[tuple[int, bool]], list[Action]]:
        """Pages the engine hands over (or adopts from the directory, with ``copies``).

        Returns [(gid, needs_bytes)] and the demotions that must run first; ``needs_bytes``
        is None when pinned pages leave no room right now (the caller retries). Never
        raises half way: victims already chosen always come back as actions."""
        with self.lock:
            state = self._session(owner, session)
            out: list[tuple[int, bool]] = []
            actions: list[Action] = []
            for meta in metas:
                gid = self.by_key.get((meta.key, state.hbm))
                rec = self.pages.get(gid) if gid is not None else None
                if rec is None:
                    rec = self._new_record(meta, state.hbm, now)
                    if copies and meta.key in copies:
                        rec.copies, rec.pool = dict(copies[meta.key]), pool
                self.by_pid[(owner, session, meta.page_id)] = rec.gid
                state.pages.add(rec.gid)
                if rec.resident or rec.busy or (copies and rec.copies):
                    out.append((rec.gid, False))
                    continue
                try:
                    actions += self._make_room(rec.hbm, rec.view.size_bytes, now, owner)
                except HbmFull:
                    out.append((rec.gid, None))  # type: ignore[arg-type] - retry later
                    continue
                self._insert(rec, now, Codec.FULL)
                self._set_busy(rec, True)  # until ``ingested``: no bytes to demote yet
                out.append((rec.gid, True))
            return out, actions

    def ingested(self, gids: Iterable[int], ok: bool = True) -> list[Action]:
        """The HBM actor holds the bytes of newly admitted pages (or failed to get them).

        Fixed-prefix pages are written through to the pool at once (FULL): they are the
        pages other sessions and nodes share through the directory."""
        out = []
        with self.lock:
            for gid in gids:
                rec = self.pages.get(gid)
                if rec is None:
                    continue
                self._set_busy(rec, False)
                if not ok and rec.resident:
                    self._evict(rec, tracked=True)
                elif ok and rec.meta.state_type is StateType.FIXED_PREFIX and not rec.copies:
                    self._set_busy(rec, True)
                    out.append(Action(kind=ActionKind.DEMOTE, gid=gid, hbm=rec.hbm,
                                      tier=Tier.HOST, codec=Codec.FULL, keep=True,
                                      reason="write-through", session=rec.meta.session))
            self._changed()
        return out

    def remove_pool(self, name: str) -> list[int]:
        """A pool actor (or its node) is gone: its copies are. Returns gids left with none."""
        with self.lock:
            lost = []
            for rec in self.pages.values():
                if rec.pool == name:
                    rec.copies, rec.pool = {}, ""
                    if not rec.resident:
                        lost.append(rec.gid)
            self.stats["lost"] += len(lost)
            return lost

    def _set_busy(self, rec: PageRecord, busy: bool) -> None:
        """A page with a transfer in flight is never chosen as a victim."""
        rec.busy = busy
        rec.view.pinned = busy or rec.pins > 0

    def _new_record(self, meta: PageMeta, hbm: str, now: float) -> PageRecord:
        gid = next(self._gids)
        d = TYPE_DEFAULTS[meta.state_type]
        view = PageView(page_id=gid, size_bytes=self.charge(meta.length),
                        state_type=meta.state_type,
                        session=meta.session, tenant=meta.tenant, position=meta.page_id,
                        created=now, last_access=now, reuse_prob=d.reuse_prob,
                        correctness_weight=d.correctness_weight, recompute_tokens=meta.tokens)
        rec = PageRecord(gid=gid, meta=meta, view=view, hbm=hbm)
        self.pages[gid] = rec
        self.by_key[(meta.key, hbm)] = gid
        return rec

    def _insert(self, rec: PageRecord, now: float, codec: Codec) -> None:
        budget = self.hbms[rec.hbm]
        rec.view.tier, rec.view.codec = Tier.HBM, codec
        self.strategy.prepare(rec, now)
        budget.policy.on_insert(rec.view, now)
        budget.used += rec.view.size_bytes
        rec.resident, rec.resident_codec = True, codec

    def _evict(self, rec: PageRecord, tracked: bool) -> None:
        if tracked:
            self.hbms[rec.hbm].policy.on_remove(rec.gid)
        self.hbms[rec.hbm].used -= rec.view.size_bytes
        rec.resident = False

    def charge(self, length: int) -> int:
        """What a page of ``length`` bytes costs the HBM budget: whole arena pages."""
        if self.page_bytes <= 0:
            return length
        return max(1, -(-length // self.page_bytes)) * self.page_bytes

    def _make_room(self, hbm: str, need: int, now: float, tenant: str | None = None
                   ) -> list[Action]:
        """Demotions that free ``need`` bytes of ``hbm``'s budget. When pinned pages fill
        it and ``tenant`` (who asks) holds no more than its fair share of pins, pins of
        tenants above theirs are revoked first (see ``revoke_pins``)."""
        budget = self.hbms[hbm]
        short = budget.used + need - budget.capacity
        if short <= 0:
            return []
        victims = budget.policy.select_victims(short, now)
        if not victims and tenant is not None and self.revoke_pins(hbm, tenant, now):
            victims = budget.policy.select_victims(short, now)
        if not victims:
            raise HbmFull(f"{hbm}: {short} bytes needed, pinned pages fill it")
        actions = []
        for gid in victims:
            rec = self.pages[gid]
            self._evict(rec, tracked=False)  # select_victims already stopped tracking it
            rec.busy = True
            tier, codec, reference = self.strategy.demotion(rec, budget.policy, now)
            actions.append(Action(kind=ActionKind.DEMOTE, gid=gid, hbm=rec.hbm, tier=tier,
                                  codec=codec, reference=reference, start_at=now,
                                  reason="pressure", session=rec.meta.session))
            self._prefetch_later(rec, tier, codec, now)
        self.stats["demotes"] += len(actions)
        return actions

    # -- executor feedback -----------------------------------------------------------------
    def finished(self, action: Action, ok: bool, now: float, info: dict[str, Any]) -> None:
        with self.lock:
            self._changed()
            self._recalled.discard(action.gid)
            rec = self.pages.get(action.gid)
            if rec is None:
                return
            self._set_busy(rec, False)
            if action.kind is ActionKind.DEMOTE:
                for tier, codec in info.get("copies", ()):
                    rec.copies[Codec(codec)] = Tier(tier)
                rec.pool = info.get("pool") or rec.pool
                if not ok and rec.hbm in self.hbms and not rec.resident and not action.keep:
                    # the HBM copy was kept on failure: track it again
                    self._insert(rec, now, rec.resident_codec)
            elif action.kind is ActionKind.RESTORE:
                if ok:
                    rec.restored_at = now
                    rec.hidden_s = info.get("elapsed_s", 0.0) if action.reason == "prefetch" else 0.0
                elif rec.resident and rec.hbm in self.hbms:
                    self._evict(rec, tracked=True)
                    rec.pins = 0
                    rec.view.pinned = False

    def doomed(self, gid: int) -> bool:
        """The page's tenant is being erased: moves of it stop (read without the lock)."""
        rec = self.pages.get(gid)
        return rec is not None and rec.meta.tenant in self.erasing

    def forget_tenant(self, tenant: str, wait_s: float = 30.0) -> TenantForgotten:
        """Tenant erasure, first half: refuse every call of ``tenant`` from now on (until
        ``end_erase``), cancel its scheduled moves, wait (at most ``wait_s``) for the
        transfers of its pages in flight to end (queued ones give up: see ``doomed``), then
        drop every page, pin, session and graph entry of it. Loads that wait for its pages
        wake up and fail with ``TenantErased``. Returns what was dropped; the keys are for
        the HBM actors, which zero those pages."""
        with self.idle:
            self.erasing.add(tenant)
            self._changed()
            gids = [g for g, r in self.pages.items() if r.meta.tenant == tenant]
            before = len(self._scheduled)
            self._cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
            cancelled = before - len(self._scheduled)
            self.idle.wait_for(lambda: not any(self.pages[g].busy for g in gids
                                               if g in self.pages), wait_s)
            gids = [g for g, r in self.pages.items() if r.meta.tenant == tenant]
            self._returning.difference_update(gids)
            self._recalled.difference_update(gids)
            keys: dict[str, list[bytes]] = {}
            resident = pins = straggling = 0
            for gid in gids:
                rec = self.pages.pop(gid)
                keys.setdefault(rec.hbm, []).append(rec.meta.key)
                pins += rec.pins
                straggling += rec.busy
                if rec.resident:
                    resident += 1
                    if rec.hbm in self.hbms:
                        self._evict(rec, tracked=True)
                self.by_key.pop((rec.meta.key, rec.hbm), None)
                self._victims.pop(gid, None)
            self.graph.forget_tenant(tenant)
            for key in [k for k in self.by_pid if k[0] == tenant]:
                del self.by_pid[key]
            sessions = [k for k in self.sessions if k[0] == tenant]
            for key in sessions:
                state = self.sessions.pop(key)
                if state.hbm in self.hbms:
                    self.hbms[state.hbm].sessions -= 1
            self.erasures[tenant] += 1
            self._changed()
            return TenantForgotten(keys=keys, pages=len(gids), resident=resident,
                                   sessions=len(sessions), pins=pins, cancelled=cancelled,
                                   straggling=straggling)

    def begin_erase(self, tenant: str) -> None:
        """Freeze ``tenant`` first: its calls fail and its loads end with ``TenantErased``
        (the erasure's first step, before its keys are destroyed)."""
        with self.idle:
            self.erasing.add(tenant)
            self._changed()

    def end_erase(self, tenant: str) -> None:
        """The erasure is done everywhere: the tenant name may start again, empty."""
        with self.lock:
            self.erasing.discard(tenant)

    # -- lookups -------------------------------------------------------------------------------
    def record(self, gid: int) -> PageRecord:
        with self.lock:
            return self.pages[gid]
