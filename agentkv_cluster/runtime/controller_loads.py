"""The load half of ``Controller``: an engine needs pages in HBM now.

A mixin over the bookkeeping in ``controller.py``: resolves an engine's keys, pins
every page of a load (all or nothing), makes room and plans the restores, and lets a
load that found the HBM full of pinned pages wait for a change (a pin dropped, a move
ended) instead of polling. Pure like the rest of the controller: no Ray, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    HbmFull,
    Reason,
    TenantErased,
    UnknownPageKey,
)


class EngineLoads:
    """Mixed into ``Controller`` (pure: the caller serialises calls, see runtime/guard.py)."""

    def resolve(self, owner: str, session: str, keys: Iterable[bytes]) -> list[int]:
        """Keys (as returned by ``store_pages``) -> gids, checking the session may use them."""
        state = self._session(owner, session)
        gids = []
        for key in keys:
            gid = self.by_key.get((key, state.hbm))
            if gid is None or gid not in state.pages:
                raise UnknownPageKey("page not stored in this session")
            gids.append(gid)
        return gids

    def settled(self, gids: list[int]) -> bool:
        """No page of ``gids`` moves, or one of them is erased (a wait for them is over)."""
        return any(g not in self.pages or self.doomed(g) for g in gids) or \
            not any(self.pages[g].busy for g in gids)

    def check_alive(self, gids: list[int]) -> None:
        """Raise ``TenantErased`` if a page of ``gids`` was (or is being) erased."""
        if any(g not in self.pages or self.doomed(g) for g in gids):
            raise TenantErased("the pages of this load were erased with their tenant")

    def want(self, gids: list[int], step: int) -> None:
        """An engine waits for ``gids`` (step 1) or stopped waiting (-1): background moves
        of wanted pages give way (see the executor)."""
        for g in gids:
            self._wanted[g] += step
            if self._wanted[g] <= 0:
                del self._wanted[g]

    def wanted(self, gid: int) -> bool:
        """An engine waits for this page now, or will as soon as its session resumes
        (read without the lock: a hint)."""
        return self._wanted.get(gid, 0) > 0 or gid in self._recalled or gid in self._returning

    def take_victims(self, gid: int) -> list[int]:
        """The pages demoted to make room for restoring ``gid`` (once)."""
        return self._victims.pop(gid, [])

    def access(self, gids: list[int], now: float
               ) -> tuple[list[Action], list[Action], list[int], list[int]]:
        """The engine needs ``gids`` in HBM: pin them.

        Returns (demotions, restores, lost, blocked): ``lost`` pages have no copy left
        (re-prefill), ``blocked`` ones found no room now (pinned pages fill the HBM).

        The caller waits first until none of them moves (``settled``): a page being
        demoted has no copy yet."""
        self.check_alive(gids)
        # Demanded now: scheduled migrations and prefetches of these pages are moot.
        self._cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
        demotes: list[Action] = []
        restores: list[Action] = []
        lost: list[int] = []
        blocked: list[int] = []
        self._pin_all(gids, now)
        self._returning.difference_update(gids)
        short = self._short_hbms(gids)
        if short and gids:  # other tenants' pins above their share give way
            tenant = self.pages[gids[0]].meta.tenant
            if sum(self.revoke_pins(h, tenant, now) for h in short):
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
                room = self._make_room(rec.hbm, rec.view.size_bytes, now, rec.meta.tenant)
            except HbmFull:
                blocked.append(gid)
                continue
            demotes += room
            self._victims[gid] = [a.gid for a in room]
            tier, codec = self.strategy.restore_source(rec)
            self._insert(rec, now, codec)
            self._set_busy(rec, True)
            restores.append(Action(kind=ActionKind.RESTORE, gid=gid, hbm=rec.hbm,
                                   tier=tier, codec=codec, start_at=now, reason=Reason.ACCESS,
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
            # Read again: its last reuse prediction came true, its idle gap ended in a return.
            self.strategy.observe(rec, True, now, self._policy_of(rec))
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
                need[rec.hbm] = need.get(rec.hbm, 0) + rec.view.size_bytes
        if not need:
            return set()
        room = {h: self.hbms[h].capacity - self.hbms[h].used for h in need}
        for rec in self.pages.values():
            if rec.hbm in room and rec.resident and not rec.view.pinned:
                room[rec.hbm] += rec.view.size_bytes
        return {h for h, n in need.items() if n > room[h]}

    def unpin(self, gids: Iterable[int], now: float) -> int:
        """Drop one pin of each page; returns the change count after it (``wait_changed``)."""
        self._unpin_locked(gids, now)  # unpinned pages are room for a waiting load
        return self.changes

    # -- pins held by sessions: one per session and page, released, timed out, revoked --------
    def hold(self, owner: str, session: str, gids: list[int], now: float) -> None:
        """A load of the session pinned ``gids``: record them as held by the session. A
        page the session already held loses the load's extra pin, so repeated loads
        never stack pins and one ``release`` undoes them."""
        state = self.sessions.get((owner, session))
        if state is None:  # erased or gone meanwhile: nothing may stay pinned for it
            self._unpin_locked(gids, now)
            return
        self._unpin_locked([g for g in gids if g in state.pinned], now)
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
        self._unpin_locked(mine, now)
        return len(mine)

    def expire_held(self, now: float, ttl_s: float) -> int:
        """Drop pins held longer than ``ttl_s`` (a load prepared and never released)."""
        n = 0
        for state in self.sessions.values():
            old = [g for g, at in state.pinned.items() if now - at > ttl_s]
            for gid in old:
                del state.pinned[gid]
            self._unpin_locked(old, now)
            n += len(old)
        return n

    def pinned_bytes(self, hbm: str) -> dict[str, int]:
        """Budget bytes each tenant holds pinned (by its sessions' loads) on ``hbm``."""
        out: dict[str, int] = {}
        for (tenant, _), state in self.sessions.items():
            if state.hbm == hbm:
                out[tenant] = out.get(tenant, 0) + sum(
                    self.pages[g].view.size_bytes for g in state.pinned if g in self.pages)
        return out

    def revoke_pins(self, hbm: str, tenant: str, now: float) -> int:
        """``tenant`` finds ``hbm`` full of pinned pages: if it holds no more than its fair
        share of pins (capacity / tenants with a session there), revoke the oldest pins of
        every other tenant above that share until it is within it. The revoked pages
        become evictable; their holder's ``complete_load`` then finds them gone (NotFound)
        and prepares the load again. Returns how many pins were revoked."""
        budget = self.hbms[hbm]
        held = self.pinned_bytes(hbm)
        share = budget.capacity // max(1, len({*held, tenant}))
        if held.get(tenant, 0) > share:
            return 0
        revoked = 0
        for other, total in held.items():
            if other == tenant or total <= share:
                continue
            items = sorted(((at, gid, state) for (t, _), state in self.sessions.items()
                            if t == other and state.hbm == hbm
                            for gid, at in state.pinned.items()),
                           key=lambda item: item[:2])
            for _at, gid, state in items:
                if total <= share:
                    break
                del state.pinned[gid]
                self._unpin_locked([gid], now)
                total -= self.pages[gid].view.size_bytes if gid in self.pages else 0
                revoked += 1
        return revoked

    def _unpin_locked(self, gids: Iterable[int], now: float) -> None:
        for gid in gids:
            rec = self.pages.get(gid)
            if rec is not None and rec.pins > 0:
                rec.pins -= 1
                rec.view.pinned = rec.busy or rec.pins > 0
                if rec.resident and rec.hbm in self.hbms:
                    self.hbms[rec.hbm].policy.on_update(rec.view, now)
        self._changed()

    def _changed(self) -> None:
        """A pin dropped or a move ended: waiters (see ``runtime/guard.py``) look again."""
        self.changes += 1
