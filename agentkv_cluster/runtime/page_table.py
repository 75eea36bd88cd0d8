"""The page table: every page, session and HBM budget the page manager decides over.

``PageTable`` holds the state and keeps its invariants (indexes, budget bytes, pins, the
busy flag that hides a moving page from victim choice, the erasure freeze); it makes no
decision. ``Controller`` (``runtime/controller.py``) decides what moves and when, the
event planner (``runtime/event_planner.py``) turns orchestrator events into retirements
and gap moves, both over this table. Pure: no Ray, no threads, no clock (``now`` is
passed in); the controller actor serialises calls (``runtime/guard.py``), and
``changes`` counts what a waiting load may look again at (a pin dropped, a move ended).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from agentkv_cluster.policy.base import EvictionPolicy, PageView
from agentkv_cluster.runtime.demand import Demand
from agentkv_cluster.runtime.page_ids import PageIds
from agentkv_cluster.runtime.pin_share import HeldPin, revocations
from agentkv_cluster.runtime.records import (
    HbmBudget,
    HbmFull,
    PageMeta,
    PageRecord,
    SessionState,
    TenantErased,
    UnknownPageKey,
    UnknownSession,
)
from agentkv_cluster.runtime.tier_ledger import TierLedger
from agentkv_cluster.runtime.tuning import set_type
from store.types import Codec, Tier


class PageTable:
    """Pages, sessions, HBM budgets and pins of one cluster."""

    def __init__(self, page_bytes: int = 0, tier_capacity: Mapping[Tier, int] | None = None
                 ) -> None:
        """``tier_capacity``: bytes of each lower tier (HOST, NVME) in every pool, for the
        placement's capacity prices (None: unbounded)."""
        self.ledger = TierLedger(tier_capacity)
        self.hbm_pool: dict[str, str] = {}  # HBM actor -> the pool its demotions go to
        # The HBM budget counts whole arena pages (0: plain bytes): many tiny pages fill
        # an arena long before their bytes add up, so bytes alone would overcommit it.
        self.page_bytes = page_bytes
        self.pages: dict[int, PageRecord] = {}
        self.by_key: dict[tuple[bytes, str], int] = {}  # (key, hbm) -> gid
        self.by_pid = PageIds()  # (tenant, session, page id) <-> gid
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self.hbms: dict[str, HbmBudget] = {}
        self._gids = itertools.count(1)
        self._serials = itertools.count(1)  # session openings (``SessionState.serial``)
        self.changes = 0  # bumped whenever a pin drops or a move ends (runtime/guard.py waits)
        self.erasing: set[str] = set()  # tenants being erased: every call of theirs fails
        self.erasures: Counter[str] = Counter()  # erasures done per tenant (loads check it)
        self.demand = Demand()  # pages engines want in HBM now or soon (hints)

    # -- topology ---------------------------------------------------------------------------
    def add_hbm(self, name: str, capacity: int, policy: EvictionPolicy, pool: str = "") -> None:
        self.hbm_pool[name] = pool
        self.hbms[name] = HbmBudget(capacity=capacity, policy=policy)

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
            rec.resident, rec.busy, rec.leaving, rec.pins = False, False, False, 0
            rec.view.pinned = False
            state = self.sessions.get((rec.meta.tenant, rec.meta.session))
            self.by_key.pop((rec.meta.key, name), None)
            if state is not None:
                rec.hbm = state.hbm
                self.by_key.setdefault((rec.meta.key, rec.hbm), rec.gid)
            if not rec.copies:
                lost.append(rec.gid)
        self.changed()
        return lost

    def remove_pool(self, name: str, survivors: Sequence[str] = ()) -> list[int]:
        """A pool actor (or its node) is gone: its copies are. Returns gids left with none.
        HBM actors that demoted into it demote into one of ``survivors`` (the live pools)
        from now on, the one fewest HBM actors use: with none, their pages could never leave
        HBM again (every demotion failed, and their budgets overflowed)."""
        paired = Counter(p for p in self.hbm_pool.values() if p in survivors)
        for hbm, pool in self.hbm_pool.items():
            if pool == name and survivors:
                self.hbm_pool[hbm] = min(survivors, key=lambda p: (paired[p], p))
                paired[self.hbm_pool[hbm]] += 1
        lost = self.drop_copies(name)
        self.ledger.forget_pool(name)
        return lost

    def drop_copies(self, pool: str, namespace: str = "",
                    copies: Iterable[tuple[bytes, int]] | None = None) -> list[int]:
        """Copies ``pool`` holds no more: every one (the pool is gone), or ``copies`` ((key,
        codec) of ``namespace``'s pages) that a key generation's erasure overwrote. Returns
        the gids left with no copy. A page that keeps some copies keeps their ledger bytes."""
        gone: dict[bytes, set[Codec]] = {}
        for key, codec in copies or ():
            gone.setdefault(key, set()).add(Codec(codec))
        lost = []
        for rec in self.pages.values():
            drop = set(rec.copies) if copies is None else gone.get(rec.meta.key, set())
            if rec.pool != pool or not (copies is None or rec.meta.namespace == namespace
                                        and drop & rec.copies.keys()):
                continue
            rec.copies = {c: t for c, t in rec.copies.items() if c not in drop}
            if not rec.copies:
                self.ledger.release(pool, rec.gid, rec.stored)
                rec.pool, rec.stored, rec.clean_copy = "", {}, None
                if not rec.resident:
                    lost.append(rec.gid)
        self.changed()
        return lost

    def _least_loaded(self) -> str:
        if not self.hbms:
            raise HbmFull("no HBM actor is alive")
        return min(self.hbms, key=lambda n: (self.hbms[n].sessions, n))

    def hbm_used(self) -> dict[str, int]:
        """Budget bytes in use per HBM actor."""
        return {name: budget.used for name, budget in self.hbms.items()}

    # -- sessions ---------------------------------------------------------------------------
    def open_session(self, tenant: str, session: str) -> str:
        self.not_erasing(tenant)
        state = self.sessions.get((tenant, session))
        if state is None:
            state = SessionState(hbm=self._least_loaded(), serial=next(self._serials))
            self.sessions[(tenant, session)] = state
            self.hbms[state.hbm].sessions += 1
        return state.hbm

    def hbm_of(self, tenant: str, session: str) -> str:
        """The HBM actor a session is placed on (``UnknownSession`` if it is not open)."""
        return self.session(tenant, session).hbm

    def not_erasing(self, tenant: str) -> None:
        if tenant in self.erasing:
            raise TenantErased("the tenant is being erased")

    def session(self, tenant: str, session: str) -> SessionState:
        self.not_erasing(tenant)
        state = self.sessions.get((tenant, session))
        if state is None:
            raise UnknownSession(f"session {session!r} is not open")
        return state

    # -- records ----------------------------------------------------------------------------
    def record(self, gid: int) -> PageRecord:
        return self.pages[gid]

    def new_record(self, meta: PageMeta, hbm: str, now: float) -> PageRecord:
        gid = next(self._gids)
        view = PageView(page_id=gid, size_bytes=self.charge(meta.length),
                        state_type=meta.state_type,
                        session=meta.session, tenant=meta.tenant, position=meta.page_id,
                        created=now, last_access=now, recompute_tokens=meta.tokens,
                        produces_structured=meta.structured)
        set_type(view, meta.state_type, meta.length)
        rec = PageRecord(gid=gid, meta=meta, view=view, hbm=hbm)
        self.pages[gid] = rec
        self.by_key[(meta.key, hbm)] = gid
        return rec

    def charge(self, length: int) -> int:
        """What a page of ``length`` bytes costs the HBM budget: whole arena pages."""
        if self.page_bytes <= 0:
            return length
        return max(1, -(-length // self.page_bytes)) * self.page_bytes

    def set_busy(self, rec: PageRecord, busy: bool) -> None:
        """A page with a transfer in flight is never chosen as a victim."""
        rec.busy = busy
        rec.view.pinned = busy or rec.pins > 0

    def insert(self, rec: PageRecord, codec: Codec) -> None:
        """``rec`` is (or is about to be) in HBM as ``codec``: charge its budget."""
        rec.view.tier, rec.view.codec = Tier.HBM, codec
        self.hbms[rec.hbm].used += rec.view.size_bytes
        rec.resident, rec.resident_codec = True, codec

    def evict(self, rec: PageRecord, tracked: bool) -> None:
        """``rec`` leaves HBM; ``tracked``: its policy still tracks it (else a victim)."""
        if tracked:
            self.hbms[rec.hbm].policy.on_remove(rec.gid)
        self.hbms[rec.hbm].used -= rec.view.size_bytes
        rec.resident = False

    def policy_of(self, rec: PageRecord) -> EvictionPolicy | None:
        """The eviction policy of the page's HBM actor (None once that actor is gone)."""
        budget = self.hbms.get(rec.hbm)
        return budget.policy if budget is not None else None

    def drop(self, gid: int) -> PageRecord:
        """Forget page ``gid`` (retired or erased): out of HBM, the indexes and the ledger."""
        rec = self.pages.pop(gid)
        self.ledger.release(rec.pool, gid, rec.stored)
        if rec.resident and rec.hbm in self.hbms:
            self.evict(rec, tracked=True)
        self.by_key.pop((rec.meta.key, rec.hbm), None)
        self.by_pid.drop(gid)
        self.demand.forget(gid)
        return rec

    # -- lookups ----------------------------------------------------------------------------
    def resolve(self, owner: str, session: str, keys: Iterable[bytes]) -> list[int]:
        """Keys (as returned by ``store_pages``) -> gids, checking the session may use them."""
        state = self.session(owner, session)
        gids = []
        for key in keys:
            gid = self.by_key.get((key, state.hbm))
            if gid is None or gid not in state.pages:
                raise UnknownPageKey("page not stored in this session")
            gids.append(gid)
        return gids

    def share(self, meta: PageMeta, hbm: str) -> bool:
        """A prefix lookup found ``meta``'s page on ``hbm`` (held there or in the pool):
        the asking session may load it, and name it by its position (``PageIds.bind``,
        unless a page the session stored has that id). False if it is unknown."""
        gid = self.by_key.get((meta.key, hbm))
        rec = self.pages.get(gid) if gid is not None else None
        state = self.sessions.get((meta.tenant, meta.session))
        if rec is None or state is None or not (rec.resident or rec.copies):
            return False
        state.pages.add(rec.gid)
        self.by_pid.bind((meta.tenant, meta.session, meta.page_id), rec.gid, keep=True)
        return True

    def doomed(self, gid: int) -> bool:
        """The page's tenant (or namespace) is being erased: moves of it stop (read
        without the lock)."""
        rec = self.pages.get(gid)
        return rec is not None and any(rec.meta.erased_with(t) for t in self.erasing)

    def settled(self, gids: list[int]) -> bool:
        """No page of ``gids`` moves out of reach: none has its HBM copy being dropped
        (``moving_out``; one still copied out is ``leaving``, and a load takes it back),
        arriving ones aside (``arrived``), or one of them is erased (a wait is over)."""
        return self._any_gone(gids) or not any(self.pages[g].moving_out for g in gids)

    def arrived(self, gids: list[int]) -> bool:
        """No page of ``gids`` is still on its way into HBM (or one of them is erased)."""
        return self._any_gone(gids) or not any(self.pages[g].arriving for g in gids)

    def check_alive(self, gids: list[int]) -> None:
        """Raise ``TenantErased`` if a page of ``gids`` is being erased, ``UnknownPageKey``
        if one is gone (erased, or retired: the session that held it last closed)."""
        if any(self.doomed(g) for g in gids):
            raise TenantErased("the pages of this load were erased with their tenant")
        if any(g not in self.pages for g in gids):
            raise UnknownPageKey("a page of this load is gone (retired, or its session closed)")

    def _any_gone(self, gids: list[int]) -> bool:
        """A page of ``gids`` was dropped, or its tenant is being erased."""
        return any(g not in self.pages or self.doomed(g) for g in gids)

    def tenant_moving(self, tenant: str) -> bool:
        """A transfer of a page that goes with ``tenant``'s erasure is in flight."""
        return any(r.busy for r in self.pages.values() if r.meta.erased_with(tenant))

    def soon_read(self, hbm: str) -> list[PageRecord]:
        """Resident pages on ``hbm`` that a load waits for, or will as soon as its session
        resumes (``Demand.wanted``)."""
        return [rec for rec in (self.pages.get(g) for g in self.demand.gids())
                if rec is not None and rec.hbm == hbm and rec.resident]

    def short_hbms(self, gids: list[int]) -> set[str]:
        """HBM actors where the missing pages of ``gids`` cannot all fit now, even after
        evicting every unpinned page. Such a load restores none of them (all or nothing):
        restoring part only to unpin and retry would see those pages evicted by the next
        load and restored again, moving bytes and delaying everyone for nothing."""
        need: dict[str, int] = {}
        for gid in gids:
            rec = self.pages[gid]
            if not rec.resident and (rec.copies or rec.leaving):
                need[rec.hbm] = need.get(rec.hbm, 0) + rec.view.size_bytes
        if not need:
            return set()
        room = {h: self.hbms[h].capacity - self.hbms[h].used for h in need}
        for rec in self.pages.values():
            if rec.hbm in room and rec.resident and not rec.view.pinned:
                room[rec.hbm] += rec.view.size_bytes
        return {h for h, n in need.items() if n > room[h]}

    # -- pins: one per load, and one per session and page held until released ---------------
    def pin(self, rec: PageRecord) -> None:
        rec.pins += 1
        rec.view.pinned = True

    def unpin(self, gids: Iterable[int], now: float) -> int:
        """Drop one pin of each page (unpinned pages are room for a waiting load); returns
        the change count after it (``wait_changed``)."""
        for gid in gids:
            rec = self.pages.get(gid)
            if rec is not None and rec.pins > 0:
                rec.pins -= 1
                rec.view.pinned = rec.busy or rec.pins > 0
                if rec.resident and rec.hbm in self.hbms:
                    self.hbms[rec.hbm].policy.on_update(rec.view, now)
        self.changed()
        return self.changes

    def hold(self, owner: str, session: str, gids: list[int], now: float) -> None:
        """A load of the session pinned ``gids``: record them as held by the session. A
        page the session already held loses the load's extra pin, so repeated loads
        never stack pins and one ``release`` undoes them."""
        state = self.sessions.get((owner, session))
        if state is None:  # erased or gone meanwhile: nothing may stay pinned for it
            self.unpin(gids, now)
            return
        self.unpin([g for g in gids if g in state.pinned], now)
        for gid in gids:
            state.pinned[gid] = now

    def release_held(self, owner: str, session: str, gids: list[int] | None, now: float
                     ) -> int:
        """Drop the session's pins on ``gids`` (None: all of them, the session's task
        ended); returns how many it held. Pins of other sessions stay."""
        state = self.sessions.get((owner, session))
        if state is None:
            return 0
        wanted = list(state.pinned) if gids is None else gids
        mine = [g for g in wanted if state.pinned.pop(g, None) is not None]
        self.unpin(mine, now)
        return len(mine)

    def expire_held(self, now: float, ttl_s: float) -> int:
        """Drop pins held longer than ``ttl_s`` (a load prepared and never released)."""
        n = 0
        for state in self.sessions.values():
            old = [g for g, at in state.pinned.items() if now - at > ttl_s]
            for gid in old:
                del state.pinned[gid]
            self.unpin(old, now)
            n += len(old)
        return n

    def revoke_pins(self, hbm: str, tenant: str, now: float) -> int:
        """``tenant`` finds ``hbm`` full of pinned pages: if it holds no more than its fair
        share of pins (capacity / tenants with a session there), revoke the oldest pins of
        every other tenant above that share until it is within it (``pin_share``). The
        revoked pages become evictable; their holder's ``complete_load`` then finds them
        gone (NotFound) and prepares the load again. Returns how many were revoked."""
        here = [(key, state) for key, state in self.sessions.items() if state.hbm == hbm]
        pins = [HeldPin(tenant=t, session=s, gid=gid, at=at, size=self.pages[gid].view.size_bytes
                        if gid in self.pages else 0)
                for (t, s), state in here for gid, at in state.pinned.items()]
        chosen = revocations(self.hbms[hbm].capacity, tenant, (t for (t, _), _ in here), pins)
        for pin in chosen:
            del self.sessions[(pin.tenant, pin.session)].pinned[pin.gid]
            self.unpin([pin.gid], now)
        return len(chosen)

    # -- erasure freeze -----------------------------------------------------------------------
    def begin_erase(self, tenant: str) -> None:
        """Freeze ``tenant`` first: its calls fail and its loads end with ``TenantErased``
        (the erasure's first step, before its keys are destroyed)."""
        self.erasing.add(tenant)
        self.changed()

    def drop_sessions(self, tenant: str) -> int:
        """The erasure's last step here, after its pages were dropped: every session of
        ``tenant`` and its page ids go, and its erasure count rises (loads check it).
        Returns how many sessions it had."""
        self.by_pid.forget_tenant(tenant)
        sessions = [k for k in self.sessions if k[0] == tenant]
        for key in sessions:
            self.drop_session(*key)
        self.erasures[tenant] += 1
        self.changed()
        return len(sessions)

    def drop_session(self, tenant: str, session: str) -> SessionState | None:
        """Forget a session's record (closed, or its tenant erased; its pages, pins and
        page ids went first). None if it was not open."""
        state = self.sessions.pop((tenant, session), None)
        if state is not None and state.hbm in self.hbms:
            self.hbms[state.hbm].sessions -= 1
        return state

    def end_erase(self, tenant: str) -> None:
        """The erasure is done everywhere: the tenant name may start again, empty."""
        self.erasing.discard(tenant)

    def changed(self) -> None:
        """A pin dropped or a move ended: waiters (see ``runtime/guard.py``) look again."""
        self.changes += 1
