"""The page manager: decides what moves between tiers, and when. No Ray, threads, locks,
waits or clock reads (``now`` is passed in). Over the page table it turns engine calls into
``Action`` lists with one eviction policy per HBM actor and a ``Strategy`` (LRU baseline or
AgentKV); events go through ``event_planner.py``, moves planned for later wait in
``schedule.py``. The executor reports each ``TransferResult`` to ``finished``; the
controller actor serialises calls and does all waiting (``guard.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.base import EvictionPolicy
from agentkv_cluster.runtime.erasure_receipts import TenantForgotten
from agentkv_cluster.runtime.event_planner import EventPlanner
from agentkv_cluster.runtime.page_table import PageTable
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    HbmFull,
    PageConflict,
    PageMeta,
    PageRecord,
    Reason,
    TransferResult,
)
from agentkv_cluster.runtime.schedule import MoveSchedule
from agentkv_cluster.runtime.strategies import Strategy
from agentkv_cluster.runtime.tier_ledger import TierRoom
from store.types import Codec, Tier

AccessPlan = tuple[list[Action], list[Action], list[int], list[int]]  # Controller.access


class Controller:
    """Decisions over every page, session and HBM actor of one cluster."""

    def __init__(self, strategy: Strategy, page_bytes: int = 0,
                 tier_capacity: Mapping[Tier, int] | None = None) -> None:
        """``tier_capacity``: see ``PageTable``."""
        self.strategy = strategy
        self.table = PageTable(page_bytes, tier_capacity)
        self.schedule = MoveSchedule()
        self.stats = {"events": 0, "demotes": 0, "restores": 0, "prefetches": 0, "lost": 0,
                      "taken_back": 0, "kept_in_hbm": 0}
        self.events = EventPlanner(self.table, self.schedule, strategy, self.stats)
        self._victims: dict[int, list[int]] = {}  # restore gid -> gids demoted for its room

    # -- topology -----------------------------------------------------------------------------
    def add_hbm(self, name: str, capacity: int, pool: str = "") -> None:
        self.table.add_hbm(name, capacity, self.strategy.new_policy(capacity), pool)

    def remove_hbm(self, name: str) -> list[int]:
        """``PageTable.remove_hbm``; the pages left with no copy count as lost."""
        return self._lost(self.table.remove_hbm(name))

    def remove_pool(self, name: str, survivors: Sequence[str] = ()) -> list[int]:
        """``PageTable.remove_pool``; the pages left with no copy count as lost."""
        return self._lost(self.table.remove_pool(name, survivors))

    def _lost(self, gids: list[int]) -> list[int]:
        self.stats["lost"] += len(gids)
        return gids

    # -- engine side --------------------------------------------------------------------------
    def admit(self, owner: str, session: str, metas: list[PageMeta], now: float,
              copies: dict[bytes, dict[Codec, Tier]] | None = None, pool: str = ""
              ) -> tuple[list[tuple[int, bool]], list[Action]]:
        """Pages the engine hands over (or adopts from the directory, with ``copies``).

        Returns [(gid, needs_bytes)] and the demotions that must run first; ``needs_bytes``
        is None when pinned pages leave no room right now, or (gid 0, nothing admitted) a
        deletion of a retired page under that key still runs (the caller retries). Never
        raises half way: a ``PageConflict`` (an identity held with another size) refuses
        all first, and victims already chosen always come back as actions."""
        table = self.table
        state = table.session(owner, session)
        sizes: dict[bytes, int] = {}  # an identity already stored keeps its first copy
        for meta in metas:
            rec = table.pages.get(table.by_key.get((meta.key, state.hbm), 0))
            if sizes.setdefault(meta.key, rec.meta.length if rec else meta.length) != meta.length:
                raise PageConflict(f"page {meta.page_id}: its identity is stored with "
                                   f"{sizes[meta.key]} bytes, this page has {meta.length}")
        out: list[tuple[int, bool]] = []
        actions: list[Action] = []
        for meta in metas:
            gid = table.by_key.get((meta.key, state.hbm))
            rec = table.pages.get(gid) if gid is not None else None
            if rec is None:
                if self.events.deleting(meta.key):  # a retired page's deletion (by key) runs:
                    out.append((0, None))  # type: ignore[arg-type] - it would drop this one
                    continue
                rec = table.new_record(meta, state.hbm, now)
                if copies and meta.key in copies:
                    rec.copies, rec.pool = dict(copies[meta.key]), pool
            table.by_pid.bind((owner, session, meta.page_id), rec.gid, keep=bool(copies))
            state.pages.add(rec.gid)
            rec.mark_structured(meta.structured)  # any storer's code/JSON output marks it
            if needs := not (rec.resident or rec.busy or (copies and rec.copies)):
                try:
                    actions += self._make_room(rec.hbm, rec.view.size_bytes, now, owner)
                except HbmFull:  # retry later (a store refused in the end: forget_unstored)
                    out.append((rec.gid, None))  # type: ignore[arg-type]
                    continue
                self._insert(rec, now, Codec.FULL)
                table.set_busy(rec, True)  # until ``ingested``: no bytes to demote yet
            out.append((rec.gid, needs))
        return out, actions

    def ingested(self, gids: list[int], ok: bool = True) -> list[Action]:
        """The HBM actor holds the bytes of newly admitted pages (or failed to get them).

        Fixed-prefix pages are written through to the pool at once (FULL): they are the
        pages other sessions and nodes share through the directory."""
        out = []
        for gid in gids:
            rec = self.table.pages.get(gid)
            if rec is None:  # retired while its bytes came in
                out += self.events.left_behind(gid, landed=ok)
                continue
            self.table.set_busy(rec, False)
            if not ok and rec.resident:
                self.table.evict(rec, tracked=True)
            elif ok and rec.meta.state_type is StateType.FIXED_PREFIX and not rec.copies:
                self.table.set_busy(rec, True)
                out.append(Action(kind=ActionKind.DEMOTE, gid=gid, hbm=rec.hbm,
                                  tier=Tier.HOST, codec=Codec.FULL, keep=True,
                                  reason=Reason.WRITE_THROUGH, session=rec.meta.session_key))
        self.table.changed()
        return out

    def access(self, gids: list[int], now: float) -> AccessPlan:
        """The engine needs ``gids`` in HBM: pin them. Returns (demotions, restores, lost,
        blocked): ``lost`` have no copy left (re-prefill), ``blocked`` found no room now
        (pinned pages fill the HBM, or all cannot fit: ``PageTable.short_hbms``). A page
        being demoted with its HBM copy in place (``PageRecord.leaving``) is taken back,
        moving nothing; the caller first waits out drops (``PageTable.settled``)."""
        table = self.table
        table.check_alive(gids)
        self.schedule.cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))  # moot now
        demotes: list[Action] = []
        restores: list[Action] = []
        lost: list[int] = []
        blocked: list[int] = []
        for gid in gids:  # every page first: making room for one must never evict another
            rec = table.pages[gid]
            table.pin(rec)
            # Read again: its last reuse prediction came true, its idle gap ended in a return.
            self.strategy.observe(rec, True, now, table.policy_of(rec))
            rec.view.last_access = now
            rec.view.access_count += 1
            rec.clean_copy = None  # read again: its next demotion is decided afresh
            if rec.resident:
                table.hbms[rec.hbm].policy.on_access(rec.view, now)
        table.demand.returning.difference_update(gids)
        short = table.short_hbms(gids)
        if short and gids:  # other tenants' pins above their share give way
            tenant = table.pages[gids[0]].meta.tenant
            if sum(table.revoke_pins(h, tenant, now) for h in short):
                short = table.short_hbms(gids)
        for gid in gids:
            rec = table.pages[gid]
            if rec.resident:
                continue
            if not rec.copies and not rec.leaving:
                lost.append(gid)
                continue
            if rec.hbm in short:
                blocked.append(gid)
                continue
            try:
                room = self._make_room(rec.hbm, rec.view.size_bytes, now, rec.meta.tenant)
            except HbmFull:
                blocked.append(gid)
                continue
            demotes += room
            if rec.leaving:  # its bytes are still in HBM (see ``PageRecord.leaving``)
                self._insert(rec, now, rec.resident_codec)
                self.stats["taken_back"] += 1
                continue
            self._victims[gid] = [a.gid for a in room]
            tier, codec = self.strategy.restore_source(rec)
            self._insert(rec, now, codec)
            table.set_busy(rec, True)
            restores.append(Action(kind=ActionKind.RESTORE, gid=gid, hbm=rec.hbm,
                                   tier=tier, codec=codec, start_at=now, reason=Reason.ACCESS,
                                   session=rec.meta.session_key))
        for gid in lost + blocked:  # not pinned: the caller retries or gives up
            rec = table.pages[gid]
            rec.pins -= 1
            rec.view.pinned = rec.pins > 0
        self.stats["restores"] += len(restores)
        return demotes, restores, lost, blocked

    def take_victims(self, gid: int) -> list[int]:
        """The pages demoted to make room for restoring ``gid`` (once)."""
        return self._victims.pop(gid, [])

    # -- room, victims and their placement ------------------------------------------------------
    def _insert(self, rec: PageRecord, now: float, codec: Codec, admitted: bool = False) -> None:
        """``rec`` is (or is about to be) in HBM as ``codec``; ``admitted``: tracked already."""
        if not admitted:
            self.strategy.prepare(rec, now)
            self.table.hbms[rec.hbm].policy.on_insert(rec.view, now)
        self.table.insert(rec, codec)

    def _make_room(self, hbm: str, need: int, now: float, tenant: str | None = None
                   ) -> list[Action]:
        """Demotions that free ``need`` bytes of ``hbm``'s budget. When pinned pages fill
        it and ``tenant`` (who asks) holds no more than its fair share of pins, pins of
        tenants above theirs are revoked first (see ``PageTable.revoke_pins``)."""
        budget = self.table.hbms[hbm]
        short = budget.used + need - budget.capacity
        if short <= 0:
            return []
        self.strategy.refresh(budget.policy, now)
        victims = self._select_victims(budget.policy, hbm, short, now)
        if not victims and tenant is not None and self.table.revoke_pins(hbm, tenant, now):
            victims = budget.policy.select_victims(short, now)
        if not victims:
            raise HbmFull(f"{hbm}: {short} bytes needed, pinned pages fill it")
        return self._demote_victims(victims, budget.policy, now)

    def _select_victims(self, policy: EvictionPolicy, hbm: str, short: int, now: float
                        ) -> list[int]:
        """The policy's victims for ``short`` bytes, sparing pages a load waits for or soon
        will (``PageTable.soon_read``) while others free enough (it would restore them)."""
        spared = [rec.view for rec in self.table.soon_read(hbm) if not rec.view.pinned]
        for view in spared:
            view.pinned = True
        try:
            victims = policy.select_victims(short, now)
        finally:
            for view in spared:
                view.pinned = False
        return victims or policy.select_victims(short, now)

    def _demote_victims(self, victims: list[int], policy: EvictionPolicy, now: float
                        ) -> list[Action]:
        """Pressure demotions of ``victims`` (no longer tracked by the policy), each to the
        tier and form the strategy picks, with a refill scheduled."""
        actions = []
        for gid in victims:
            rec = self.table.pages[gid]
            self.table.evict(rec, tracked=False)
            rec.busy = rec.leaving = True  # its HBM copy stays until the worker decides
            clean = rec.clean_copy
            tier, codec, reference = (rec.copies[clean], clean, False) if clean in rec.copies \
                else self.strategy.demotion(rec, policy, now, self._tier_room(rec, policy))
            actions.append(Action(kind=ActionKind.DEMOTE, gid=gid, hbm=rec.hbm, tier=tier,
                                  codec=codec, reference=reference, start_at=now,
                                  reason=Reason.PRESSURE, session=rec.meta.session_key))
            self.events.refill_later(rec, tier, codec, now)
        self.stats["demotes"] += len(actions)
        return actions

    def _tier_room(self, rec: PageRecord, policy: EvictionPolicy) -> TierRoom | None:
        """Free bytes and capacity prices of the lower tiers of the pool ``rec`` goes to."""
        pages = self.table.pages
        pool = rec.pool or self.table.hbm_pool.get(rec.hbm, "")
        return self.table.ledger.room(
            pool, lambda gids: [pages[g].view for g in gids if g in pages],
            lambda views, cap: self.strategy.tier_prices(policy, views, cap))

    # -- moves planned for later ----------------------------------------------------------------
    def apply(self, event: ev.Event, now: float) -> list[Action]:
        """Run one event through the planner; returns its retirements and the moves due."""
        return self.events.apply(event, now) + self.due(now)

    def due(self, now: float) -> list[Action]:
        """Scheduled gap migrations and prefetches whose start time has come."""
        table = self.table
        out: list[Action] = []
        for action in self.schedule.pop_due(now):
            rec = table.pages.get(action.gid)
            if rec is None or rec.hbm not in table.hbms or rec.hbm != action.hbm:
                continue
            if rec.busy:
                if action.kind is ActionKind.RESTORE and not rec.resident:
                    # Its migration has not finished by the time the page must come
                    # back: recall it (a queued one gives way) and look again shortly.
                    table.demand.recalled.add(rec.gid)
                    self.schedule.push(action, at=now + 0.02)
                continue
            if action.kind is ActionKind.DEMOTE:
                if rec.resident and rec.pins == 0:
                    table.evict(rec, tracked=True)
                    rec.busy = rec.leaving = True  # its HBM copy stays until decided
                    out.append(action)
                    self.stats["demotes"] += 1
                continue
            if rec.resident or not rec.copies or table.demand.wanted(rec.gid):
                continue
            out += self._prefetch(rec, now)
        return out

    def _prefetch(self, rec: PageRecord, now: float) -> list[Action]:
        """Bring ``rec`` back ahead of its session's return if the strategy admits it into
        its HBM budget (``admit_prefetch``: it displaces only pages it does no harm to,
        those read later than it); the displaced pages are demoted."""
        budget = self.table.hbms[rec.hbm]
        short = budget.used + rec.view.size_bytes - budget.capacity
        tier, codec = self.strategy.restore_source(rec)
        victims = self.strategy.admit_prefetch(rec, budget.policy, tier, codec, short, now)
        if victims is None:
            return []  # prefetch is best effort: the access path restores on demand
        demotes = self._demote_victims(victims, budget.policy, now)
        self._insert(rec, now, codec, admitted=True)
        self.table.set_busy(rec, True)
        self.stats["prefetches"] += 1
        return demotes + [Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                                 codec=codec, start_at=now, reason=Reason.PREFETCH,
                                 session=rec.meta.session_key)]

    # -- executor feedback ----------------------------------------------------------------------
    def finished(self, result: TransferResult, now: float) -> list[Action]:
        action, ok = result.action, result.ok
        table = self.table
        table.changed()
        table.demand.recalled.discard(action.gid)
        rec = table.pages.get(action.gid)
        if rec is None:  # retired meanwhile: what the move left goes too (deletions)
            return self.events.moved_after_retire(result)
        table.set_busy(rec, False)
        rec.leaving = False
        if action.kind is ActionKind.DEMOTE:
            rec.pool = result.pool or rec.pool
            for (tier, codec), n in zip(result.copies, result.tier_bytes):
                rec.copies[codec] = tier
                rec.stored[tier] = rec.stored.get(tier, 0) + n
                table.ledger.add(rec.pool, rec.gid, tier, n)
            here = rec.hbm == action.hbm and rec.hbm in table.hbms  # not died meanwhile
            if not ok and here and not rec.resident and not action.keep:
                self._insert(rec, now, rec.resident_codec)  # kept on failure: track it again
            elif ok and rec.resident and not action.keep:  # kept (``keep_if_room``): clean
                rec.clean_copy = rec.copy_for(action.codec)
        elif action.kind is ActionKind.RESTORE:
            if ok:
                rec.hidden_s = result.elapsed_s if action.reason is Reason.PREFETCH else 0.0
            elif rec.resident and rec.hbm == action.hbm and rec.hbm in table.hbms:
                table.evict(rec, tracked=True)  # each load unpins its own pins
                rec.view.pinned = rec.pins > 0
        return []

    def keep_if_room(self, gid: int, now: float) -> bool:
        """A demotion copied the page out, its HBM copy still in place: keep that copy if
        a load took the page back, or if the room it left is still free (dropping it would
        only make its return restore it). A kept page is clean (``clean_copy``), and no
        victim until ``finished``. True if kept; else a load now waits for the drop."""
        table = self.table
        rec = table.pages.get(gid)
        if rec is None:
            return False
        rec.leaving = False  # decided: a load that comes now waits for the drop, then restores
        if rec.resident:  # a load took it back while it moved (``access``)
            return True
        budget = table.hbms.get(rec.hbm)
        if budget is None or budget.used + rec.view.size_bytes > budget.capacity:
            return False
        self._insert(rec, now, rec.resident_codec)
        table.set_busy(rec, True)  # still moving: pinned for victim choice
        self.stats["kept_in_hbm"] += 1
        return True

    # -- tenant erasure -------------------------------------------------------------------------
    def begin_forget(self, tenant: str) -> int:
        """Tenant erasure, first half: refuse ``tenant``'s calls (until ``end_erase``), cancel
        its scheduled moves (returns how many; queued transfers give up: ``PageTable.doomed``).
        The caller waits until ``tenant_moving`` is false, then calls ``forget_tenant``."""
        self.table.begin_erase(tenant)
        gids = [g for g, r in self.table.pages.items() if r.meta.erased_with(tenant)]
        return self.schedule.cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))

    def forget_tenant(self, tenant: str, cancelled: int | None = None) -> TenantForgotten:
        """Tenant erasure, second half: drop every page, pin, session and graph entry of
        ``tenant`` (after ``begin_forget``; called alone it does both halves without
        waiting). Loads that wait for its pages wake up and fail with ``TenantErased``.
        Returns what was dropped; the keys are for the HBM actors, which zero those pages."""
        if cancelled is None:
            cancelled = self.begin_forget(tenant)
        table = self.table
        gids = [g for g, r in table.pages.items() if r.meta.erased_with(tenant)]
        keys: dict[str, list[bytes]] = {}
        resident = pins = straggling = 0
        for gid in gids:
            rec = table.pages[gid]
            self.strategy.forget(rec, table.policy_of(rec))
            keys.setdefault(rec.hbm, []).append(rec.meta.key)
            pins += rec.pins
            straggling += rec.busy
            resident += rec.resident
            table.drop(gid)
            self._victims.pop(gid, None)
        self.strategy.forget_tenant(tenant)
        self.events.graph.forget_tenant(tenant)
        sessions = table.drop_sessions(tenant)
        return TenantForgotten(keys=keys, pages=len(gids), resident=resident,
                               sessions=sessions, pins=pins, cancelled=cancelled,
                               straggling=straggling)
