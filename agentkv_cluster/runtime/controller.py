"""The page manager: the controller's bookkeeping around the pure lifecycle and policy objects.

``Controller`` holds no Ray, no threads, no locks, no waits and reads no clock (``now``
is passed in). It turns engine calls and orchestrator events into ``Action`` lists
(demote, restore, delete) using the event graph, one eviction policy per HBM actor and a
``Strategy`` (LRU baseline or AgentKV); the executor carries the actions out and reports
back a ``TransferResult`` through ``finished``. The controller actor serialises calls
and does all waiting (``runtime/guard.py``).
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterable, Mapping

from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.base import EvictionPolicy, PageView
from agentkv_cluster.runtime.controller_events import EventScheduling
from agentkv_cluster.runtime.controller_loads import EngineLoads
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    AuditSummary,
    HbmBudget,
    HbmFull,
    PageMeta,
    PageRecord,
    Reason,
    SessionState,
    TenantErased,
    TenantForgotten,
    TransferResult,
    UnknownSession,
)
from agentkv_cluster.runtime.strategies import Strategy, set_type
from agentkv_cluster.runtime.tier_ledger import TierLedger, TierRoom
from store.types import Codec, Tier

AUDIT_BACKLOG = 100_000  # retired-page summaries kept until the service drains them


class Controller(EngineLoads, EventScheduling):
    """Bookkeeping for every page, session and HBM actor of one cluster."""

    def __init__(self, strategy: Strategy, page_bytes: int = 0,
                 tier_capacity: Mapping[Tier, int] | None = None) -> None:
        """``tier_capacity``: bytes of each lower tier (HOST, NVME) in every pool, for the
        placement's capacity prices (None: unbounded)."""
        self.strategy = strategy
        self.ledger = TierLedger(tier_capacity)
        self.hbm_pool: dict[str, str] = {}  # HBM actor -> the pool its demotions go to
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
        self.changes = 0  # bumped whenever a pin drops or a move ends (runtime/guard.py waits)
        self.stats = {"events": 0, "demotes": 0, "restores": 0, "prefetches": 0, "lost": 0}
        self._wanted: Counter[int] = Counter()  # gids an engine load is waiting for
        self._recalled: set[int] = set()  # gids whose prefetch is due while still moving out
        # Pages of sessions whose tool has returned, until the engine loads them (or the
        # next tool starts): the load is imminent, so background moves of them give way.
        self._returning: set[int] = set()
        self._victims: dict[int, list[int]] = {}  # restore gid -> gids demoted for its room
        self.erasing: set[str] = set()  # tenants being erased: every call of theirs fails
        self.erasures: Counter[str] = Counter()  # erasures done per tenant (loads check it)
        # Summaries of retired audited pages, until the service appends them to its audit
        # log (``drain_audit``); bounded so a service that never drains cannot grow it.
        self.audit_summaries: deque[AuditSummary] = deque(maxlen=AUDIT_BACKLOG)

    # -- topology -------------------------------------------------------------------------
    def add_hbm(self, name: str, capacity: int, pool: str = "") -> None:
        self.hbm_pool[name] = pool
        self.hbms[name] = HbmBudget(capacity=capacity, policy=self.strategy.new_policy(capacity))

    def remove_hbm(self, name: str) -> list[int]:
        """An HBM actor died: only its HBM copies are gone. Returns gids with no copy left."""
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
        self._not_erasing(tenant)
        state = self.sessions.get((tenant, session))
        if state is None:
            state = SessionState(hbm=self._least_loaded())
            self.sessions[(tenant, session)] = state
            self.hbms[state.hbm].sessions += 1
        return state.hbm

    def hbm_of(self, tenant: str, session: str) -> str:
        """The HBM actor a session is placed on (``UnknownSession`` if it is not open)."""
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
                                  reason=Reason.WRITE_THROUGH, session=rec.meta.session))
        self._changed()
        return out

    def remove_pool(self, name: str) -> list[int]:
        """A pool actor (or its node) is gone: its copies are. Returns gids left with none."""
        lost = []
        self.ledger.forget_pool(name)
        for rec in self.pages.values():
            if rec.pool == name:
                rec.copies, rec.pool, rec.stored = {}, "", {}
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
        view = PageView(page_id=gid, size_bytes=self.charge(meta.length),
                        state_type=meta.state_type,
                        session=meta.session, tenant=meta.tenant, position=meta.page_id,
                        created=now, last_access=now, recompute_tokens=meta.tokens)
        set_type(view, meta.state_type, meta.length)
        rec = PageRecord(gid=gid, meta=meta, view=view, hbm=hbm)
        self.pages[gid] = rec
        self.by_key[(meta.key, hbm)] = gid
        return rec

    def _insert(self, rec: PageRecord, now: float, codec: Codec, admitted: bool = False) -> None:
        """``rec`` is (or is about to be) in HBM as ``codec``; ``admitted``: its policy
        already tracks it (a prefetch it admitted)."""
        budget = self.hbms[rec.hbm]
        rec.view.tier, rec.view.codec = Tier.HBM, codec
        if not admitted:
            self.strategy.prepare(rec, now)
            budget.policy.on_insert(rec.view, now)
        budget.used += rec.view.size_bytes
        rec.resident, rec.resident_codec = True, codec

    def _evict(self, rec: PageRecord, tracked: bool) -> None:
        if tracked:
            self.hbms[rec.hbm].policy.on_remove(rec.gid)
        self.hbms[rec.hbm].used -= rec.view.size_bytes
        rec.resident = False

    def _policy_of(self, rec: PageRecord) -> EvictionPolicy | None:
        """The eviction policy of the page's HBM actor (None once that actor is gone)."""
        budget = self.hbms.get(rec.hbm)
        return budget.policy if budget is not None else None

    def _tier_room(self, rec: PageRecord, policy: EvictionPolicy) -> TierRoom | None:
        """Free bytes and capacity prices of the lower tiers of the pool ``rec`` goes to."""
        pool = rec.pool or self.hbm_pool.get(rec.hbm, "")
        return self.ledger.room(
            pool, lambda gids: [self.pages[g].view for g in gids if g in self.pages],
            lambda views, cap: self.strategy.tier_prices(policy, views, cap))

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
        self.strategy.refresh(budget.policy, now)
        victims = budget.policy.select_victims(short, now)
        if not victims and tenant is not None and self.revoke_pins(hbm, tenant, now):
            victims = budget.policy.select_victims(short, now)
        if not victims:
            raise HbmFull(f"{hbm}: {short} bytes needed, pinned pages fill it")
        return self._demote_victims(victims, budget.policy, now)

    def _demote_victims(self, victims: list[int], policy: EvictionPolicy, now: float
                        ) -> list[Action]:
        """Pressure demotions of ``victims`` (the policy already stopped tracking them),
        each to the tier and form the strategy picks, with a refill scheduled."""
        actions = []
        for gid in victims:
            rec = self.pages[gid]
            self._evict(rec, tracked=False)
            rec.busy = True
            tier, codec, reference = self.strategy.demotion(
                rec, policy, now, self._tier_room(rec, policy))
            actions.append(Action(kind=ActionKind.DEMOTE, gid=gid, hbm=rec.hbm, tier=tier,
                                  codec=codec, reference=reference, start_at=now,
                                  reason=Reason.PRESSURE, session=rec.meta.session))
            self._prefetch_later(rec, tier, codec, now)
        self.stats["demotes"] += len(actions)
        return actions

    # -- executor feedback -----------------------------------------------------------------
    def finished(self, result: TransferResult, now: float) -> None:
        action, ok = result.action, result.ok
        self._changed()
        self._recalled.discard(action.gid)
        rec = self.pages.get(action.gid)
        if rec is None:
            return
        self._set_busy(rec, False)
        if action.kind is ActionKind.DEMOTE:
            rec.pool = result.pool or rec.pool
            for (tier, codec), n in zip(result.copies, result.tier_bytes):
                rec.copies[codec] = tier
                rec.stored[tier] = rec.stored.get(tier, 0) + n
                self.ledger.add(rec.pool, rec.gid, tier, n)
            if not ok and rec.hbm in self.hbms and not rec.resident and not action.keep:
                # the HBM copy was kept on failure: track it again
                self._insert(rec, now, rec.resident_codec)
        elif action.kind is ActionKind.RESTORE:
            if ok:
                rec.hidden_s = result.elapsed_s if action.reason is Reason.PREFETCH else 0.0
            elif rec.resident and rec.hbm in self.hbms:
                self._evict(rec, tracked=True)
                rec.pins = 0
                rec.view.pinned = False

    def doomed(self, gid: int) -> bool:
        """The page's tenant is being erased: moves of it stop (read without the lock)."""
        rec = self.pages.get(gid)
        return rec is not None and rec.meta.tenant in self.erasing

    def begin_forget(self, tenant: str) -> int:
        """Tenant erasure, first half: refuse every call of ``tenant`` from now on (until
        ``end_erase``) and cancel its scheduled moves; queued transfers give up (see
        ``doomed``). Returns how many scheduled moves were cancelled. The caller then waits
        until ``tenant_moving`` is false (transfers in flight end) and calls
        ``forget_tenant``."""
        self.erasing.add(tenant)
        self._changed()
        gids = [g for g, r in self.pages.items() if r.meta.tenant == tenant]
        before = len(self._scheduled)
        self._cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
        return before - len(self._scheduled)

    def tenant_moving(self, tenant: str) -> bool:
        """A transfer of one of ``tenant``'s pages is in flight."""
        return any(r.busy for r in self.pages.values() if r.meta.tenant == tenant)

    def forget_tenant(self, tenant: str, cancelled: int | None = None) -> TenantForgotten:
        """Tenant erasure, second half: drop every page, pin, session and graph entry of
        ``tenant`` (after ``begin_forget``; called alone it does both halves without
        waiting). Loads that wait for its pages wake up and fail with ``TenantErased``.
        Returns what was dropped; the keys are for the HBM actors, which zero those pages."""
        if cancelled is None:
            cancelled = self.begin_forget(tenant)
        gids = [g for g, r in self.pages.items() if r.meta.tenant == tenant]
        self._returning.difference_update(gids)
        self._recalled.difference_update(gids)
        keys: dict[str, list[bytes]] = {}
        resident = pins = straggling = 0
        for gid in gids:
            rec = self.pages.pop(gid)
            self.ledger.release(rec.pool, gid, rec.stored)
            self.strategy.forget(rec, self._policy_of(rec))
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
        self.erasing.add(tenant)
        self._changed()

    def end_erase(self, tenant: str) -> None:
        """The erasure is done everywhere: the tenant name may start again, empty."""
        self.erasing.discard(tenant)

    def drain_audit(self) -> list[AuditSummary]:
        """The audit summaries of pages retired since the last call (oldest first)."""
        out = list(self.audit_summaries)
        self.audit_summaries.clear()
        return out

    def share(self, meta: PageMeta, hbm: str) -> bool:
        """A prefix lookup found ``meta``'s page on ``hbm`` (held there or in the pool):
        the asking session may load it under its own page id. False if it is unknown."""
        gid = self.by_key.get((meta.key, hbm))
        rec = self.pages.get(gid) if gid is not None else None
        state = self.sessions.get((meta.tenant, meta.session))
        if rec is None or state is None or not (rec.resident or rec.copies):
            return False
        state.pages.add(rec.gid)
        self.by_pid[(meta.tenant, meta.session, meta.page_id)] = rec.gid
        return True

    def hbm_used(self) -> dict[str, int]:
        """Budget bytes in use per HBM actor."""
        return {name: budget.used for name, budget in self.hbms.items()}

    # -- lookups -------------------------------------------------------------------------------
    def record(self, gid: int) -> PageRecord:
        return self.pages[gid]
