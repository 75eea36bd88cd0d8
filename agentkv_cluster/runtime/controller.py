"""The controller's bookkeeping: a thin loop around the pure lifecycle and policy objects.

``Controller`` holds no Ray and does no I/O. It turns engine calls and orchestrator
events into ``Action`` lists (demote, restore, delete) using the event graph, one
eviction policy per HBM actor and a ``Strategy`` (LRU baseline or AgentKV); the
executor carries the actions out and reports back with ``finished``. Time is
passed in. One lock guards the state because the controller actor is threaded.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_records import Blocker
from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType, UnknownPage
from agentkv_cluster.policy.base import EvictionPolicy, GapPlan, PageView
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    PageMeta,
    PageRecord,
    UnknownPageKey,
    UnknownSession,
)
from agentkv_cluster.runtime.strategies import Strategy
from store.types import Codec, Tier

# Gap migrations run only while the HBM actor is at least this full (high watermark).
GAP_WATERMARK = 0.75
_PAGE_LIST_FIELDS = ("prefix_pages", "input_pages", "consumes", "supersedes", "pages")


class HbmFull(Exception):
    """Pinned pages alone fill the HBM actor: nothing can be admitted or restored."""


@dataclass(slots=True)
class HbmBudget:
    capacity: int
    policy: EvictionPolicy
    used: int = 0
    sessions: int = 0


@dataclass(slots=True)
class SessionState:
    hbm: str
    pages: set[int] = field(default_factory=set)
    tools: dict[str, tuple[str, float, GapPlan | None]] = field(default_factory=dict)


class Controller:
    """Bookkeeping for every page, session and HBM actor of one cluster."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
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
        self.stats = {"events": 0, "demotes": 0, "restores": 0, "prefetches": 0, "lost": 0}
        self._wanted: Counter[int] = Counter()  # gids an engine load is waiting for
        self._recalled: set[int] = set()  # gids whose prefetch is due while still moving out
        # Pages of sessions whose tool has returned, until the engine loads them (or the
        # next tool starts): the load is imminent, so background moves of them give way.
        self._returning: set[int] = set()
        self._victims: dict[int, list[int]] = {}  # restore gid -> gids demoted for its room

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
            self.idle.notify_all()
            return lost

    def _least_loaded(self) -> str:
        if not self.hbms:
            raise HbmFull("no HBM actor is alive")
        return min(self.hbms, key=lambda n: (self.hbms[n].sessions, n))

    def open_session(self, tenant: str, session: str) -> str:
        with self.lock:
            state = self.sessions.get((tenant, session))
            if state is None:
                state = SessionState(hbm=self._least_loaded())
                self.sessions[(tenant, session)] = state
                self.hbms[state.hbm].sessions += 1
            return state.hbm

    def _session(self, tenant: str, session: str) -> SessionState:
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
                    actions += self._make_room(rec.hbm, meta.length, now)
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
            self.idle.notify_all()
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
        view = PageView(page_id=gid, size_bytes=meta.length, state_type=meta.state_type,
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
        budget.used += rec.meta.length
        rec.resident, rec.resident_codec = True, codec

    def _evict(self, rec: PageRecord, tracked: bool) -> None:
        if tracked:
            self.hbms[rec.hbm].policy.on_remove(rec.gid)
        self.hbms[rec.hbm].used -= rec.meta.length
        rec.resident = False

    def _make_room(self, hbm: str, need: int, now: float) -> list[Action]:
        budget = self.hbms[hbm]
        short = budget.used + need - budget.capacity
        if short <= 0:
            return []
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

    def _prefetch_later(self, rec: PageRecord, tier: Tier, codec: Codec, now: float) -> None:
        """A page pushed out while its session waits on a tool comes back before the tool's
        predicted return if there is free room then (a "refill"; it never evicts, or two
        sessions in tools would push each other out in turn). Without it every pressure
        victim costs its session a foreground restore on resume."""
        state = self.sessions.get((rec.meta.tenant, rec.meta.session))
        if state is None or not state.tools:
            return
        plan = list(state.tools.values())[-1][2]
        at = self.strategy.prefetch_at(rec, plan, tier, codec, now)
        if at is None:
            return
        action = Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                        codec=codec, start_at=at, reason="refill", session=rec.meta.session)
        heapq.heappush(self._scheduled, (at, next(self._seq), action))
        self.stats["refills"] = self.stats.get("refills", 0) + 1

    def resolve(self, owner: str, session: str, keys: Iterable[bytes]) -> list[int]:
        """Keys (as returned by ``store_pages``) -> gids, checking the session may use them."""
        with self.lock:
            state = self._session(owner, session)
            gids = []
            for key in keys:
                gid = self.by_key.get((key, state.hbm))
                if gid is None or gid not in state.pages:
                    raise UnknownPageKey("page not stored in this session")
                gids.append(gid)
            return gids

    def wait_idle(self, gids: list[int], timeout_s: float) -> bool:
        """Block until no page of ``gids`` has a demote or restore in flight. While it
        waits the pages are ``wanted``: background moves of them give way (see executor)."""
        with self.idle:
            self._want(gids, 1)
            try:
                return self.idle.wait_for(
                    lambda: not any(self.pages[g].busy for g in gids if g in self.pages),
                    timeout_s)
            finally:
                self._want(gids, -1)

    def _want(self, gids: list[int], step: int) -> None:
        for g in gids:
            self._wanted[g] += step
            if self._wanted[g] <= 0:
                del self._wanted[g]

    def wanted(self, gid: int) -> bool:
        """An engine waits for this page now, or will as soon as its session resumes
        (read without the lock: a hint)."""
        return self._wanted.get(gid, 0) > 0 or gid in self._recalled or gid in self._returning

    def keep_if_wanted(self, gid: int, now: float) -> bool:
        """A gap migration finished with the HBM copy still in place (the page is still
        busy): keep that copy if the page is wanted now and fits, rather than dropping it
        and restoring it again for the load that waits. True if kept."""
        with self.lock:
            rec = self.pages.get(gid)
            if rec is None or rec.resident or not self.wanted(gid) or rec.hbm not in self.hbms:
                return False
            budget = self.hbms[rec.hbm]
            if budget.used + rec.meta.length > budget.capacity:
                return False
            self._insert(rec, now, rec.resident_codec)
            self.stats["kept_on_return"] = self.stats.get("kept_on_return", 0) + 1
            return True

    def take_victims(self, gid: int) -> list[int]:
        """The pages demoted to make room for restoring ``gid`` (once)."""
        with self.lock:
            return self._victims.pop(gid, [])

    def access(self, gids: list[int], now: float
               ) -> tuple[list[Action], list[Action], list[int], list[int]]:
        """The engine needs ``gids`` in HBM: pin them.

        Returns (demotions, restores, lost, blocked): ``lost`` pages have no copy left
        (re-prefill), ``blocked`` ones found no room now (pinned pages fill the HBM).

        Waits (lock released) while any of them is being demoted or restored: a page
        being demoted has no copy yet."""
        with self.idle:
            self._want(gids, 1)
            try:
                self.idle.wait_for(lambda: not any(self.pages[g].busy for g in gids
                                                   if g in self.pages), 60.0)
            finally:
                self._want(gids, -1)
            # Demanded now: scheduled migrations and prefetches of these pages are moot.
            self._cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
            demotes: list[Action] = []
            restores: list[Action] = []
            lost: list[int] = []
            blocked: list[int] = []
            self._pin_all(gids, now)
            self._returning.difference_update(gids)
            short = self._short_hbms(gids)
            for gid in gids:
                rec = self.pages[gid]
                if rec.resident:
                    continue
                if not rec.copies:
                    lost.append(gid)
                    continue
                if rec.hbm in short:
                    blocked.append(gid)
                    continue
                try:
                    room = self._make_room(rec.hbm, rec.meta.length, now)
                except HbmFull:
                    blocked.append(gid)
                    continue
                demotes += room
                self._victims[gid] = [a.gid for a in room]
                tier, codec = self.strategy.restore_source(rec)
                self._insert(rec, now, codec)
                self._set_busy(rec, True)
                restores.append(Action(kind=ActionKind.RESTORE, gid=gid, hbm=rec.hbm,
                                       tier=tier, codec=codec, start_at=now, reason="access",
                                       session=rec.meta.session))
            for gid in lost + blocked:  # not pinned: the caller retries or gives up
                rec = self.pages[gid]
                rec.pins -= 1
                rec.view.pinned = rec.pins > 0
            self.stats["restores"] += len(restores)
            return demotes, restores, lost, blocked

    def _pin_all(self, gids: list[int], now: float) -> None:
        """Pin every requested page first: making room for one must never evict another."""
        for gid in gids:
            rec = self.pages[gid]
            rec.pins += 1
            rec.view.pinned = True
            rec.view.last_access = now
            rec.view.access_count += 1
            if rec.resident:
                self.hbms[rec.hbm].policy.on_access(rec.view, now)

    def _short_hbms(self, gids: list[int]) -> set[str]:
        """HBM actors where the missing pages of ``gids`` cannot all fit now, even after
        evicting every unpinned page. Such a load restores none of them (all or nothing):
        restoring part only to unpin and retry would see those pages evicted by the next
        load and restored again, moving bytes and delaying everyone for nothing."""
        need: dict[str, int] = {}
        for gid in gids:
            rec = self.pages[gid]
            if not rec.resident and rec.copies:
                need[rec.hbm] = need.get(rec.hbm, 0) + rec.meta.length
        if not need:
            return set()
        room = {h: self.hbms[h].capacity - self.hbms[h].used for h in need}
        for rec in self.pages.values():
            if rec.hbm in room and rec.resident and not rec.view.pinned:
                room[rec.hbm] += rec.meta.length
        return {h for h, n in need.items() if n > room[h]}

    def unpin(self, gids: Iterable[int], now: float) -> None:
        with self.lock:
            for gid in gids:
                rec = self.pages.get(gid)
                if rec is not None and rec.pins > 0:
                    rec.pins -= 1
                    rec.view.pinned = rec.pins > 0
                    if rec.resident and rec.hbm in self.hbms:
                        self.hbms[rec.hbm].policy.on_update(rec.view, now)

    # -- executor feedback -----------------------------------------------------------------
    def finished(self, action: Action, ok: bool, now: float, info: dict[str, Any]) -> None:
        with self.lock:
            self.idle.notify_all()
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

    def forget_tenant(self, tenant: str) -> dict[str, list[bytes]]:
        """Tenant erasure: drop every page, session and scheduled move of ``tenant``;
        returns the keys that were resident, per HBM actor (the caller zeroes them)."""
        with self.lock:
            gids = [g for g, r in self.pages.items() if r.meta.tenant == tenant]
            self._cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
            self._returning.difference_update(gids)
            resident: dict[str, list[bytes]] = {}
            for gid in gids:
                rec = self.pages.pop(gid)
                if rec.resident:
                    resident.setdefault(rec.hbm, []).append(rec.meta.key)
                    self._evict(rec, tracked=True)
                self.by_key.pop((rec.meta.key, rec.hbm), None)
                with contextlib.suppress(UnknownPage):  # no event mentioned the page
                    self.graph.retire(gid)
            for key in [k for k in self.by_pid if k[0] == tenant]:
                del self.by_pid[key]
            for key in [k for k in self.sessions if k[0] == tenant]:
                state = self.sessions.pop(key)
                if state.hbm in self.hbms:
                    self.hbms[state.hbm].sessions -= 1
            return resident

    # -- orchestrator events -----------------------------------------------------------------
    def translate(self, owner: str, session: str, data: dict[str, Any]) -> ev.Event:
        """Wire event -> typed event with engine page ids mapped to global ids."""
        data = dict(data, tenant=owner, session=session)
        with self.lock:
            for name in _PAGE_LIST_FIELDS:
                if isinstance(data.get(name), list):
                    data[name] = [self._gid(owner, session, pid) for pid in data[name]]
            if isinstance(data.get("produces"), list):
                data["produces"] = [
                    [self._gid(owner, session, r[0]), *r[1:]] if isinstance(r, list) and r else r
                    for r in data["produces"]]
        return ev.event_from_dict(data)

    def _gid(self, owner: str, session: str, pid: Any) -> Any:
        if type(pid) is not int:
            return pid  # left for event_from_dict to reject with a precise message
        gid = self.by_pid.get((owner, session, pid))
        if gid is None:
            raise ev.UnknownReference(f"page {pid} was not stored in session {session!r}")
        return gid

    def apply(self, event: ev.Event, now: float) -> list[Action]:
        """Run one event through the graph and the strategy; returns actions due now."""
        with self.lock:
            state = self._session(event.tenant, event.session)
            touched = self.graph.apply(event, now)
            self.stats["events"] += 1
            for gid in touched:
                rec = self.pages.get(gid)
                if rec is not None:
                    try:
                        rec.view.dependency = self.graph.dependency_strength(gid)
                    except KeyError:
                        pass  # a page the engine stored but no event produced yet
            actions: list[Action] = []
            if isinstance(event, ev.ToolStart):
                self._tool_start(state, event, now)
            elif isinstance(event, ev.ObservationReturn):
                self._tool_return(state, event, now)
            elif isinstance(event, ev.ModelCall):
                self._cancel(list(state.pages))
            if isinstance(event, ev.TaskEnd):
                self._cancel(list(state.pages))
                self._returning.difference_update(state.pages)
                touched = frozenset(state.pages)
            for gid in sorted(touched):
                if gid in self.pages and gid in state.pages and self._retirable(gid):
                    actions.append(self._retire(gid, state, now))
            return actions + self.due(now)

    def _retirable(self, gid: int) -> bool:
        try:
            blockers = self.graph.blockers(gid)
        except KeyError:
            return False
        if blockers == {Blocker.AUDIT}:
            # The audit summary is the page's identity and type, which the service keeps.
            self.graph.record_audit_summary(gid)
            return True
        return not blockers

    def _tool_start(self, state: SessionState, event: ev.ToolStart, now: float) -> None:
        self._returning.difference_update(state.pages)
        budget = self.hbms[state.hbm]
        recs = [self.pages[g] for g in sorted(state.pages)
                if self.pages[g].resident and not self.pages[g].busy and self.pages[g].pins == 0
                and self.pages[g].hbm == state.hbm]
        actions, plan = self.strategy.gap_plan(recs, event, budget.policy, now)
        if budget.used < GAP_WATERMARK * budget.capacity:
            # Room to spare: moving the pausing session's pages out frees HBM nobody
            # needs, and bringing them back only delays its return and moves bytes.
            actions = []
        state.tools[event.call_id] = (event.tool, now, plan)
        self.stats["gap_migrations"] = self.stats.get("gap_migrations", 0) + sum(
            a.kind is ActionKind.DEMOTE for a in actions)
        self.stats["gap_prefetches"] = self.stats.get("gap_prefetches", 0) + sum(
            a.kind is ActionKind.RESTORE for a in actions)
        for action in actions:
            heapq.heappush(self._scheduled, (action.start_at, next(self._seq), action))

    def _tool_return(self, state: SessionState, event: ev.ObservationReturn, now: float) -> None:
        tool = state.tools.pop(event.call_id, None)
        if tool is None:
            return
        recs = [self.pages[g] for g in sorted(state.pages) if g in self.pages]
        self.strategy.tool_return(tool[2], recs, self.hbms[state.hbm].policy, tool[0], tool[1], now)
        # As the policy's early-return report says: migrations and prefetches not started
        # yet are cancelled. The engine's load now restores those pages in the foreground
        # class; one left scheduled would start late and make that load wait behind it.
        self._cancel(list(state.pages), kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
        self._returning.update(g for g in state.pages if g in self.pages)

    def _cancel(self, gids: list[int], kinds: tuple[ActionKind, ...] = (ActionKind.DEMOTE,)) -> None:
        drop = set(gids)
        kept = [item for item in self._scheduled
                if not (item[2].gid in drop and item[2].kind in kinds)]
        if len(kept) != len(self._scheduled):
            heapq.heapify(kept)
            self._scheduled = kept

    def _retire(self, gid: int, state: SessionState, now: float) -> Action:
        self._returning.discard(gid)
        rec = self.pages.pop(gid)
        if rec.resident:
            self._evict(rec, tracked=True)
        self.by_key.pop((rec.meta.key, rec.hbm), None)
        state.pages.discard(gid)
        self.graph.retire(gid)
        shared = any((rec.meta.key, h) in self.by_key for h in self.hbms)
        return Action(kind=ActionKind.DELETE, gid=gid, hbm=rec.hbm, start_at=now,
                      reason="shared" if shared else "retire", session=rec.meta.session,
                      tenant=rec.meta.namespace, key=rec.meta.key, pool=rec.pool)

    def due(self, now: float) -> list[Action]:
        """Scheduled gap migrations and prefetches whose start time has come."""
        with self.lock:
            out: list[Action] = []
            while self._scheduled and self._scheduled[0][0] <= now:
                _, _, action = heapq.heappop(self._scheduled)
                rec = self.pages.get(action.gid)
                if rec is None or rec.hbm not in self.hbms or rec.hbm != action.hbm:
                    continue
                if rec.busy:
                    if action.kind is ActionKind.RESTORE and not rec.resident:
                        # Its migration has not finished by the time the page must come
                        # back: recall it (a queued one gives way) and look again shortly.
                        self._recalled.add(rec.gid)
                        heapq.heappush(self._scheduled, (now + 0.02, next(self._seq), action))
                    continue
                if action.kind is ActionKind.DEMOTE:
                    if rec.resident and rec.pins == 0:
                        self._evict(rec, tracked=True)
                        rec.busy = True
                        out.append(action)
                        self.stats["demotes"] += 1
                    continue
                if rec.resident or not rec.copies or self.wanted(rec.gid):
                    continue
                out += self._prefetch(rec, now, evict=action.reason != "refill")
            return out

    def _prefetch(self, rec: PageRecord, now: float, evict: bool = True) -> list[Action]:
        if not evict:  # a refill only uses free room: evicting for it would ping-pong
            budget = self.hbms[rec.hbm]
            if budget.used + rec.meta.length > budget.capacity:
                return []
        try:
            demotes = self._make_room(rec.hbm, rec.meta.length, now)
        except HbmFull:
            return []  # prefetch is best effort: the access path restores on demand
        tier, codec = self.strategy.restore_source(rec)
        self._insert(rec, now, codec)
        self._set_busy(rec, True)
        self.stats["prefetches"] += 1
        return demotes + [Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                                 codec=codec, start_at=now, reason="prefetch",
                                 session=rec.meta.session)]

    def next_due(self) -> float | None:
        with self.lock:
            return self._scheduled[0][0] if self._scheduled else None

    def record(self, gid: int) -> PageRecord:
        with self.lock:
            return self.pages[gid]
