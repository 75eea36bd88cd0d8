"""Orchestrator events -> the event graph, page types, retirements and tool-gap moves.

``EventPlanner`` runs each event through the lifecycle graph (``lifecycle/graph.py``)
over the page table: pages whose type the graph changed (draft -> verified result,
branch -> failed branch) are retyped for the policy, retirable pages are retired (an
audited one leaves its §5.2 summary first), a tool start schedules the strategy's gap
migrations and prefetches, a tool return reports the gap to the strategy and cancels the
moves not started, and a page pushed out by pressure during its session's tool call is
refilled before the tool's predicted return. Pure: no Ray, no I/O, time passed in.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Any

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_records import Blocker
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.page_table import PageTable
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    PageMeta,
    PageRecord,
    Reason,
    SessionState,
    TransferResult,
    UnknownPageKey,
)
from agentkv_cluster.runtime.schedule import MoveSchedule
from agentkv_cluster.runtime.strategies import Strategy
from agentkv_cluster.runtime.tuning import set_type
from store.types import Codec, Tier

# Gap migrations run only while the HBM actor is at least this full (high watermark).
GAP_WATERMARK = 0.75
AUDIT_BACKLOG = 100_000  # retired-page summaries kept until the service drains them
_PAGE_LIST_FIELDS = ("prefix_pages", "input_pages", "consumes", "supersedes", "pages")


@dataclass(frozen=True, kw_only=True)
class AuditSummary:
    """What a retired page of an audited type leaves behind (paper §5.2): an irreversible
    summary and content hash; the KV bytes themselves are deleted."""

    tenant: str
    session: str
    identity_digest: bytes  # PageIdentity.digest(): which state this was
    state_type: StateType
    tokens: int
    content_hash: bytes  # BLAKE2b-128 of the bytes, as stored
    retired_at: float

    @classmethod
    def of(cls, meta: PageMeta, state_type: StateType, now: float) -> AuditSummary:
        """``state_type``: the page's type when it retired (events may have changed it)."""
        return cls(tenant=meta.tenant, session=meta.session, identity_digest=meta.digest,
                   state_type=state_type, tokens=meta.tokens,
                   content_hash=meta.content_hash, retired_at=now)

    def record(self) -> dict[str, object]:
        """The audit log's entry (JSON-safe)."""
        return {"tenant": self.tenant, "session": self.session,
                "identity": self.identity_digest.hex(), "type": self.state_type.value,
                "tokens": self.tokens, "content_hash": self.content_hash.hex(),
                "retired_at": self.retired_at}


@dataclass(frozen=True, kw_only=True)
class SessionClosed:
    """What closing a session did (``EventPlanner.close_session``)."""

    closed: bool  # False: it was not open (closed already, or never opened); nothing done
    tasks: int = 0  # open tasks it ended, as their TaskEnd would
    retired: int = 0  # pages that went: the session was the last to hold them
    kept: int = 0  # pages that stay (another session holds them, or PUBLIC): its hold went
    pins: int = 0  # pins it held (loads prepared and not released)
    cancelled: int = 0  # scheduled migrations and prefetches of its pages

    def wire(self) -> dict[str, bool | int]:
        """As the ``close_session`` reply carries it (docs/protocol.md)."""
        return {"closed": self.closed, "tasks": self.tasks, "retired": self.retired,
                "kept": self.kept, "pins": self.pins, "cancelled": self.cancelled}


class EventPlanner:
    def __init__(self, table: PageTable, schedule: MoveSchedule, strategy: Strategy,
                 stats: dict[str, int]) -> None:
        self.table = table
        self.schedule = schedule
        self.strategy = strategy
        self.stats = stats  # the controller's counters
        self.graph = EventGraph()
        # Summaries of retired audited pages, until the service appends them to its audit
        # log (``drain_audit``); bounded so a service that never drains cannot grow it.
        self.audit_summaries: deque[AuditSummary] = deque(maxlen=AUDIT_BACKLOG)
        # Pages retired while a move of them was in flight, by gid: their deletion ran
        # before that move ended, so what the move leaves goes after it (``left_behind``).
        self.retired_moving: dict[int, Action] = {}
        # Keys with a deletion on its way (built, not yet reported done). A deletion drops
        # by key, so a page stored again under one meanwhile would go with it: ``admit``
        # waits for it (``deleting``).
        self.deletions: Counter[bytes] = Counter()

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
        gid = self.table.by_pid.get((owner, session, pid))
        if gid is None:
            raise UnknownPageKey(f"page {pid} was not stored in session {session!r}")
        rec = self.table.pages.get(gid)
        if rec is not None and rec.meta.namespace != owner:
            # A PUBLIC page is every opted-in tenant's, read-only: naming it made it this
            # task's, so a reader could retype it, block others' events on it, leave
            # page_retired records in its publisher's name and delete it for everyone.
            raise ev.ConflictingEvent(f"page {pid} is in the PUBLIC namespace: shared and "
                                      "read-only, no task's to declare, retype or retire")
        return gid

    def apply(self, event: ev.Event, now: float) -> list[Action]:
        """Run one event through the graph and the strategy; returns the retirements (gap
        moves go to the schedule)."""
        table = self.table
        state = table.session(event.tenant, event.session)
        touched = self.graph.apply(event, now)
        self.stats["events"] += 1
        for gid in touched:
            rec = table.pages.get(gid)
            if rec is not None:
                try:
                    rec.view.dependency = self.graph.dependency_strength(gid)
                    state_type = self.graph.page(gid).tag.state_type
                except KeyError:
                    continue  # a page the engine stored but no event produced yet
                if state_type is not rec.view.state_type:
                    self._retype(rec, state_type, now)
        if isinstance(event, ev.ToolStart):
            self._tool_start(state, event, now)
        elif isinstance(event, ev.ObservationReturn):
            self._tool_return(state, event, now)
        elif isinstance(event, ev.ModelCall):
            self.schedule.cancel(list(state.pages))
        if isinstance(event, ev.TaskEnd):
            self.schedule.cancel(list(state.pages))
            table.demand.returning.difference_update(state.pages)
            touched = frozenset(state.pages)
        retired = []
        for gid in sorted(touched):
            if gid not in table.pages or gid not in state.pages:
                continue
            if self._held_elsewhere(gid, event.tenant, event.session):
                self._end_hold(gid, event.tenant, event.session, state)
            elif self._retirable(gid, now):
                retired.append(self._retire(gid, state, now))
        return retired

    def _retype(self, rec: PageRecord, state_type: StateType, now: float) -> None:
        """The event graph changed the page's type (draft -> verified result, a branch's
        pages -> failed branch, ...): the policy sees the new type and its Table 1 priors
        from now on (value, risk protection, demotion form)."""
        set_type(rec.view, state_type, rec.meta.length)
        self.strategy.prepare(rec, now)
        if rec.resident and rec.hbm in self.table.hbms:
            self.table.hbms[rec.hbm].policy.on_update(rec.view, now)
        self.stats["retyped"] = self.stats.get("retyped", 0) + 1

    def _retirable(self, gid: int, now: float, closing: bool = False) -> bool:
        """Whether page ``gid`` may retire now; writes the summary of an audited page that
        may (or that goes anyway: its session is ``closing``)."""
        rec = self.table.pages[gid]
        try:
            blockers = self.graph.blockers(gid)
        except KeyError:  # no event named it: only a close retires it, audited by its type
            if not (closing and rec.view.state_type in self.graph.policy.audit_types):
                return False
            blockers = None
        if blockers is None or blockers == {Blocker.AUDIT} or \
                (closing and Blocker.AUDIT in blockers):
            # §5.2: the page may go once its irreversible summary (identity digest, type,
            # content hash) is on its way to the audit log (``drain_audit``).
            self.audit_summaries.append(AuditSummary.of(rec.meta, rec.view.state_type, now))
            if blockers is not None:
                self.graph.record_audit_summary(gid)
            return True
        return not blockers

    def _tool_start(self, state: SessionState, event: ev.ToolStart, now: float) -> None:
        table = self.table
        table.demand.returning.difference_update(state.pages)
        budget = table.hbms[state.hbm]
        recs = [rec for rec in (table.pages[g] for g in sorted(state.pages))
                if rec.resident and not rec.busy and rec.pins == 0 and rec.hbm == state.hbm]
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
            self.schedule.push(action)

    def _tool_return(self, state: SessionState, event: ev.ObservationReturn, now: float) -> None:
        tool = state.tools.pop(event.call_id, None)
        if tool is None:
            return
        table = self.table
        recs = [table.pages[g] for g in sorted(state.pages) if g in table.pages]
        self.strategy.tool_return(tool[2], recs, table.hbms[state.hbm].policy, tool[0], tool[1],
                                  now)
        # As the policy's early-return report says: migrations and prefetches not started
        # yet are cancelled. The engine's load now restores those pages in the foreground
        # class; one left scheduled would start late and make that load wait behind it.
        self.schedule.cancel(list(state.pages), kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
        table.demand.returning.update(g for g in state.pages if g in table.pages)

    def _held_elsewhere(self, gid: int, tenant: str, session: str) -> bool:
        """Whether another session stored page ``gid`` too (the same identity: one page)
        and still holds it."""
        table = self.table
        return any(gid in table.sessions[s].pages for s in table.by_pid.holders(gid)
                   if s != (tenant, session) and s in table.sessions)

    def _end_hold(self, gid: int, tenant: str, session: str, state: SessionState,
                  closing: bool = False) -> None:
        """The session is done with a page another session still holds: only its hold
        goes (deleting the page made the other's loads answer ``not_found``). Nothing is
        retired, so no §5.2 summary is written either (it would say the page is gone); an
        audited page keeps its graph record until its last holder retires it. A session
        that is ``closing`` lets go of the page whatever its graph record says."""
        try:
            blockers: frozenset[Blocker] | None = self.graph.blockers(gid)
        except KeyError:
            blockers = None  # a page no event produced: it stays with the session, as before
        if not closing and (blockers is None or blockers - {Blocker.AUDIT}):
            return  # still needed by this session's task
        state.pages.discard(gid)
        self.table.by_pid.drop_session(gid, tenant, session)
        if blockers is not None and not blockers:
            self.graph.retire(gid)  # its graph record was this session's task's

    def _retire(self, gid: int, state: SessionState, now: float, closing: bool = False
                ) -> Action:
        """The last session holding page ``gid`` is done with it: it goes (``closing``:
        whatever its graph record says, see ``close_session``)."""
        table = self.table
        rec = table.pages[gid]
        # Retired unread since its last prediction: its idle gap ended without a return.
        self.strategy.observe(rec, False, now, table.policy_of(rec))
        table.drop(gid)
        state.pages.discard(gid)
        if closing:
            self.graph.drop_page(gid)  # whatever still blocks it (none if it is unknown)
        else:
            self.graph.retire(gid)
        action = Action(kind=ActionKind.DELETE, gid=gid, hbm=rec.hbm, start_at=now,
                        reason=Reason.SHARED if self._held(rec.meta.key) else Reason.RETIRE,
                        session=rec.meta.session_key, tenant=rec.meta.namespace,
                        key=rec.meta.key, pool=rec.pool)
        if rec.busy:  # a demotion, restore or ingest of it is in flight
            self.retired_moving[gid] = action
        self.deletions[action.key] += 1
        return action

    def forget_unstored(self, owner: str, session: str, gids: list[int]) -> None:
        """A store was refused (no room in the end): the pages it admitted that have no
        bytes anywhere leave the session, and the page table where no one else holds them
        (they stayed, loadable only as ``page_lost``, and events could name them)."""
        table, state = self.table, self.table.sessions.get((owner, session))
        for gid in gids:
            rec = table.pages.get(gid)
            if rec is None or state is None or rec.resident or rec.busy or rec.copies:
                continue
            state.pages.discard(gid)
            table.by_pid.drop_session(gid, owner, session)
            if not self._held_elsewhere(gid, owner, session):
                table.drop(gid)

    def deleting(self, key: bytes) -> bool:
        """A deletion of ``key`` was built and has not been reported done."""
        return self.deletions[key] > 0

    def _held(self, key: bytes) -> set[str]:
        """The HBM actors on which a live page holds ``key`` (the same key is the same
        bytes: a retired page's copies under it are still someone's)."""
        return {h for h in self.table.hbms if (key, h) in self.table.by_key}

    def moved_after_retire(self, result: TransferResult) -> list[Action]:
        """``left_behind`` for a move that ended (a deletion itself leaves nothing)."""
        move = result.action
        if move.kind is ActionKind.DELETE:  # done (or failed): the key may be stored again
            self.deletions[move.key] -= 1
            if self.deletions[move.key] <= 0:
                del self.deletions[move.key]
            return []
        return self.left_behind(move.gid, result.ok and move.kind is ActionKind.RESTORE,
                                result.pool if result.copies else "")

    def left_behind(self, gid: int, landed: bool = False, pool: str = "") -> list[Action]:
        """A move of page ``gid`` ended: if the page was retired meanwhile, the deletion
        of what the move left after that retirement's own deletion ran: the HBM page it
        ``landed`` (a restore, an ingest) and the copies it wrote to ``pool`` (a demotion).
        Nothing goes that a live page holds under the same key (pages are immutable: the
        same key is the same bytes)."""
        retired = self.retired_moving.pop(gid, None)
        if retired is None:
            return []
        live = self._held(retired.key)
        hbm = retired.hbm if landed and retired.hbm not in live else ""
        pool = "" if live else pool
        if not (hbm or pool):
            return []
        self.deletions[retired.key] += 1
        return [replace(retired, hbm=hbm, pool=pool, reason=Reason.RETIRE)]

    def close_session(self, tenant: str, session: str, now: float
                      ) -> tuple[SessionClosed, list[Action]]:
        """Close a session (``closed`` false if it is not open: closing is idempotent). Its
        open tasks end as their ``TaskEnd`` would (``EventGraph.end_session``) and each of
        its pages goes as their end retires it: a page another session holds stays, only
        this session's hold goes (so does a PUBLIC page: it is the namespace's, and no
        task's end ever retires it); an audited page leaves its §5.2 summary first. Unlike
        a task's end, nothing is kept for the session (a current fixed prefix, a page no
        event produced): the session that kept them is gone. Its scheduled moves are cancelled, its pins
        released, and every record of it forgotten (page table, page ids, event graph,
        strategy): opened again, the session starts afresh. Returns what it did and the
        deletions to run."""
        table = self.table
        table.not_erasing(tenant)
        state = table.sessions.get((tenant, session))
        if state is None:
            return SessionClosed(closed=False), []
        tasks = self.graph.end_session(tenant, session)
        gids = sorted(state.pages)
        cancelled = self.schedule.cancel(gids, kinds=(ActionKind.DEMOTE, ActionKind.RESTORE))
        table.demand.returning.difference_update(gids)
        pins = table.release_held(tenant, session, None, now)
        retired, kept = [], 0
        for gid in gids:
            if gid not in table.pages:
                state.pages.discard(gid)
            elif self._held_elsewhere(gid, tenant, session) or \
                    table.pages[gid].meta.namespace != tenant:  # PUBLIC: every tenant's
                self._end_hold(gid, tenant, session, state, closing=True)
                kept += 1
            else:  # an audited page leaves its summary (``_retirable``), then it goes
                self._retirable(gid, now, closing=True)
                retired.append(self._retire(gid, state, now, closing=True))
        table.drop_session(tenant, session)
        self.strategy.forget_session(tenant, session)
        table.changed()  # loads waiting for its pages look again (and end)
        return SessionClosed(closed=True, tasks=tasks, retired=len(retired), kept=kept,
                             pins=pins, cancelled=cancelled), retired

    def drain_audit(self) -> list[AuditSummary]:
        """The audit summaries of pages retired since the last call (oldest first)."""
        out = list(self.audit_summaries)
        self.audit_summaries.clear()
        return out

    def refill_later(self, rec: PageRecord, tier: Tier, codec: Codec, now: float) -> None:
        """A page pushed out while its session waits on a tool comes back before the tool's
        predicted return (a "refill"), if the strategy admits it then: it may displace only
        pages read later than it (``Controller._prefetch``), so two sessions in tools never
        push each other out in turn. Without it every pressure victim costs its session a
        foreground restore on resume."""
        state = self.table.sessions.get((rec.meta.tenant, rec.meta.session))
        if state is None or not state.tools:
            return
        plan = list(state.tools.values())[-1][2]
        at = self.strategy.prefetch_at(rec, plan, tier, codec, now)
        if at is None:
            return
        self.schedule.push(Action(kind=ActionKind.RESTORE, gid=rec.gid, hbm=rec.hbm, tier=tier,
                                  codec=codec, start_at=at, reason=Reason.REFILL,
                                  session=rec.meta.session_key))
        self.stats["refills"] = self.stats.get("refills", 0) + 1
