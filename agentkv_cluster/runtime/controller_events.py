"""The event half of ``Controller``: orchestrator events, tool gaps and scheduled moves.

A mixin over the bookkeeping in ``controller.py`` (pages, sessions, HBM budgets, the
lock): turns events into retirements, schedules the strategy's gap migrations and
prefetches and the refills of pages pushed out during a tool call, and hands them out
when due. Pure like the rest of the controller: no Ray, no I/O, time passed in.
"""

from __future__ import annotations

import heapq
from typing import Any

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph_records import Blocker
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    AuditSummary,
    PageRecord,
    Reason,
    SessionState,
)
from agentkv_cluster.runtime.strategies import set_type
from store.types import Codec, Tier

# Gap migrations run only while the HBM actor is at least this full (high watermark).
GAP_WATERMARK = 0.75
_PAGE_LIST_FIELDS = ("prefix_pages", "input_pages", "consumes", "supersedes", "pages")


class EventScheduling:
    """Mixed into ``Controller`` (pure: the caller serialises calls, see runtime/guard.py)."""

    def _prefetch_later(self, rec: PageRecord, tier: Tier, codec: Codec, now: float) -> None:
        """A page pushed out while its session waits on a tool comes back before the tool's
        predicted return (a "refill"), if the strategy admits it then: it may displace only
        pages read later than it (``_prefetch``), so two sessions in tools never push each
        other out in turn. Without it every pressure victim costs its session a
        foreground restore on resume."""
        state = self.sessions.get((rec.meta.tenant, rec.meta.session))
        if state is None or not state.tools:
            return
        plan = list(state.tools.values())[-1][2]
        at = self.strategy.prefetch_at(rec, plan, tier, codec, now)
        if at is None:
            return
        action = Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                        codec=codec, start_at=at, reason=Reason.REFILL, session=rec.meta.session)
        heapq.heappush(self._scheduled, (at, next(self._seq), action))
        self.stats["refills"] = self.stats.get("refills", 0) + 1

    def keep_if_wanted(self, gid: int, now: float) -> bool:
        """A gap migration finished with the HBM copy still in place (the page is still
        busy): keep that copy if the page is wanted now and fits, rather than dropping it
        and restoring it again for the load that waits. True if kept."""
        rec = self.pages.get(gid)
        if rec is None or rec.resident or not self.wanted(gid) or rec.hbm not in self.hbms:
            return False
        budget = self.hbms[rec.hbm]
        if budget.used + rec.view.size_bytes > budget.capacity:
            return False
        self._insert(rec, now, rec.resident_codec)
        self.stats["kept_on_return"] = self.stats.get("kept_on_return", 0) + 1
        return True

    def translate(self, owner: str, session: str, data: dict[str, Any]) -> ev.Event:
        """Wire event -> typed event with engine page ids mapped to global ids."""
        data = dict(data, tenant=owner, session=session)
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
        state = self._session(event.tenant, event.session)
        touched = self.graph.apply(event, now)
        self.stats["events"] += 1
        for gid in touched:
            rec = self.pages.get(gid)
            if rec is not None:
                try:
                    rec.view.dependency = self.graph.dependency_strength(gid)
                    state_type = self.graph.page(gid).tag.state_type
                except KeyError:
                    continue  # a page the engine stored but no event produced yet
                if state_type is not rec.view.state_type:
                    self._retype(rec, state_type, now)
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
            if gid in self.pages and gid in state.pages and self._retirable(gid, now):
                actions.append(self._retire(gid, state, now))
        return actions + self.due(now)

    def _retype(self, rec: PageRecord, state_type: StateType, now: float) -> None:
        """The event graph changed the page's type (draft -> verified result, a branch's
        pages -> failed branch, ...): the policy sees the new type and its Table 1 priors
        from now on (value, risk protection, demotion form)."""
        set_type(rec.view, state_type, rec.meta.length)
        self.strategy.prepare(rec, now)
        if rec.resident and rec.hbm in self.hbms:
            self.hbms[rec.hbm].policy.on_update(rec.view, now)
        self.stats["retyped"] = self.stats.get("retyped", 0) + 1

    def _retirable(self, gid: int, now: float) -> bool:
        try:
            blockers = self.graph.blockers(gid)
        except KeyError:
            return False
        if blockers == {Blocker.AUDIT}:
            # §5.2: the page may go once its irreversible summary (identity digest, type,
            # content hash) is on its way to the audit log (``drain_audit``).
            rec = self.pages[gid]
            self.audit_summaries.append(AuditSummary.of(rec.meta, rec.view.state_type, now))
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
        self.ledger.release(rec.pool, gid, rec.stored)
        # Retired unread since its last prediction: its idle gap ended without a return.
        self.strategy.observe(rec, False, now, self._policy_of(rec))
        if rec.resident:
            self._evict(rec, tracked=True)
        self.by_key.pop((rec.meta.key, rec.hbm), None)
        state.pages.discard(gid)
        self.graph.retire(gid)
        shared = any((rec.meta.key, h) in self.by_key for h in self.hbms)
        return Action(kind=ActionKind.DELETE, gid=gid, hbm=rec.hbm, start_at=now,
                      reason=Reason.SHARED if shared else Reason.RETIRE, session=rec.meta.session,
                      tenant=rec.meta.namespace, key=rec.meta.key, pool=rec.pool)

    def due(self, now: float) -> list[Action]:
        """Scheduled gap migrations and prefetches whose start time has come."""
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
            out += self._prefetch(rec, now)
        return out

    def _prefetch(self, rec: PageRecord, now: float) -> list[Action]:
        """Bring ``rec`` back ahead of its session's return if the strategy admits it into
        its HBM budget (``admit_prefetch``: it displaces only pages it does no harm to,
        those read later than it); the displaced pages are demoted."""
        budget = self.hbms[rec.hbm]
        short = budget.used + rec.view.size_bytes - budget.capacity
        tier, codec = self.strategy.restore_source(rec)
        victims = self.strategy.admit_prefetch(rec, budget.policy, tier, codec, short, now)
        if victims is None:
            return []  # prefetch is best effort: the access path restores on demand
        demotes = self._demote_victims(victims, budget.policy, now)
        self._insert(rec, now, codec, admitted=True)
        self._set_busy(rec, True)
        self.stats["prefetches"] += 1
        return demotes + [Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                                 codec=codec, start_at=now, reason=Reason.PREFETCH,
                                 session=rec.meta.session)]

    def next_due(self) -> float | None:
        return self._scheduled[0][0] if self._scheduled else None
