"""The discrete-event loop: one batch, one policy driver, exact bookkeeping of HBM bytes.

Events, in time order: a page is produced (CREATE), read again (ACCESS), its
end-of-life signal arrives as delivered (EOL: the signal-quality model may have
lost or delayed it), a premature "dead" signal arrives (FALSE: the page will
still be read), or a planned prefetch starts (PREFETCH). A page retired on a
false signal that is read again pays a full recompute (re-prefill), counted.
HBM holds at most ``capacity_bytes``; whenever bytes must come in, the policy
picks victims ("exactly enough or nothing") and the driver says where and in
what form each victim goes. Restores and prefetches share one host link and
queue on it. The driver hears of each production and of the batch's end
(``produced``, ``finish``) as well as of reads and signals, so a learner can
tell how every idle gap ended. The loop records facts only; ``metrics`` turns
them into numbers.

Events come from an ``EventQueue`` (``schedule.py``: their order, ties included)
that holds only what can come next. A page's state (``_Slot``) is made when it is
produced and dropped once it is done (no read or signal to come, no prefetch
planned, not in HBM), so a trace of millions of pages holds state for the pages
live at once. Its ``PageView`` is made then too if the driver's views read nothing
it learns (``views_on_demand``); otherwise every view is made at the batch's start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agentkv_cluster.policy.base import PageView
from agentkv_cluster.sim.drivers import Demotion, PolicyDriver, retype_due
from agentkv_cluster.sim.metrics import risk_of_read, wrong_eviction_weight
from agentkv_cluster.sim.schedule import ACCESS, CREATE, EOL, FALSE, PREFETCH, EventQueue
from agentkv_cluster.sim.workload import SIGNAL_ORDER, TYPE_ORDER, Batch, label_at
from store.types import Codec, Tier

__all__ = ["ACCESS", "CREATE", "EOL", "FALSE", "PREFETCH", "BatchRun", "BatchTrace", "PageEnd"]
PROGRESS_PAGES = 4096  # a replay reports its progress every this many pages

IN_HBM, LOWER, PREFETCHING, NOT_YET, RETIRED = 0, 1, 2, 3, 4


@dataclass(slots=True)
class _Slot:
    """Simulator-side state of one page (the policy sees only the PageView)."""

    view: PageView
    where: int = NOT_YET
    demotion: Demotion | None = None
    ready_at: float = 0.0  # when an in-flight prefetch lands
    restore_ms: float = 0.0  # full duration of that prefetch
    prefetch_token: int = 0  # bumps to cancel a scheduled prefetch
    next_access: int = 0
    demotions: int = 0
    unread_prefetch: int = 0  # stored bytes prefetched and not read (yet)
    due: int = 0  # reads and signals still to come
    prefetch_due: int = -1  # token of the planned prefetch not yet handled


@dataclass(frozen=True, slots=True)
class PageEnd:
    """A page whose state the loop dropped (done), or one not produced yet (NOT_YET):
    where it ended, its last demotion, how often it was demoted; its view when the
    driver made every view at the batch's start (else None)."""

    where: int
    demotion: Demotion | None
    demotions: int
    view: PageView | None


@dataclass(slots=True)
class BatchTrace:
    """Facts recorded for one batch: one entry per read, per eviction, per transfer."""

    access_bytes: list[int] = field(default_factory=list)
    access_hit: list[bool] = field(default_factory=list)
    access_visible_ms: list[float] = field(default_factory=list)
    access_restore_ms: list[float] = field(default_factory=list)  # 0 for hits
    access_risk: list[float] = field(default_factory=list)  # risk proxy of the restore
    access_weight: list[float] = field(default_factory=list)  # correctness weight
    access_wrong: list[float] = field(default_factory=list)  # wrong-eviction weight
    transfer_bytes: int = 0  # lower tier -> HBM (restores + prefetches), stored bytes
    demoted_bytes: int = 0  # to the lower tier (demotions, writes with no room), stored
    wasted_prefetch_bytes: int = 0  # prefetched pages that were never read
    overflow_events: int = 0  # bytes had to come in but the policy could free none
    retired_pages: int = 0  # pages freed on an end-of-life signal (true or false)
    false_signal_reads: int = 0  # reads of pages retired on a false signal
    false_signal_ms: float = 0.0  # recompute time those reads paid


class BatchRun:
    """Runs one batch against one driver. Single use."""

    def __init__(self, batch: Batch, driver: PolicyDriver, *, trace: BatchTrace | None = None,
                 jitter: bool = True) -> None:
        self.batch = batch
        self.driver = driver
        self.policy = driver.policy
        self.trace = trace if trace is not None else BatchTrace()
        self.used = 0
        self.link_free_at = 0.0
        self._jitter = jitter
        self._queue = EventQueue(batch)  # raises UnorderedBatch before any event
        n = batch.n_pages
        self._kinds = batch.eol_kind if batch.eol_kind is not None else np.zeros(n, np.int8)
        self._live: list[_Slot | None] = [None] * n  # produced and not done
        self._views = (None if getattr(driver, "views_on_demand", False)
                       else [self._make_view(i) for i in range(n)])
        # what done pages left (``slots``); equal demotions are kept once
        self._end_where = np.full(n, NOT_YET, np.int8)
        self._end_demotions = np.zeros(n, np.int64)
        self._end_demotion: list[Demotion | None] = [None] * n
        self._forms: dict[Demotion, Demotion] = {}
        # ground truth the metrics use (never shown to a policy); without the batch's
        # own, the view's value, copied as the page is produced (nothing changes it)
        self._copy_truth = (batch.recompute_s is None, batch.correctness is None)
        self._recompute = batch.recompute_s if batch.recompute_s is not None else np.zeros(n)
        self._weight = batch.correctness if batch.correctness is not None else np.zeros(n)

    def _make_view(self, i: int) -> PageView:
        b = self.batch
        st = TYPE_ORDER[int(b.types[i])]
        est = b.recompute_est_s
        return self.driver.make_view(
            page_id=i, size_bytes=int(b.sizes[i]), state_type=st, created=float(b.created[i]),
            predicted_idle_s=float(b.predicted_idle[i][0]),
            session=b.sessions[i] if b.sessions else "",
            tool_class=self._gap_tool(i, 0) or (b.tool_classes[i] if b.tool_classes else ""),
            recompute_est_s=None if est is None else float(est[i]))

    def _produce(self, i: int) -> _Slot:
        """The page's state, made as it is produced."""
        view = self._views[i] if self._views is not None else self._make_view(i)
        if self._copy_truth[0]:
            self._recompute[i] = view.recompute_cost_s
        if self._copy_truth[1]:
            self._weight[i] = view.correctness_weight
        s = self._live[i] = _Slot(view=view, due=self._queue.due(i))
        return s

    def _settle(self, s: _Slot) -> None:
        """Drop the page's state once it is done (module doc); its prefetched bytes
        never read count as wasted now."""
        if s.due or s.where in (IN_HBM, PREFETCHING) or s.prefetch_due == s.prefetch_token:
            return
        i = s.view.page_id
        self._live[i] = None
        self.trace.wasted_prefetch_bytes += s.unread_prefetch
        self._end_where[i] = s.where
        self._end_demotions[i] = s.demotions
        if s.demotion is not None:
            self._end_demotion[i] = self._forms.setdefault(s.demotion, s.demotion)

    @property
    def slots(self) -> list[_Slot | PageEnd]:
        """Every page's state now: its record while it is live, else a ``PageEnd``."""
        return [s if s is not None else
                PageEnd(where=int(self._end_where[i]), demotion=self._end_demotion[i],
                        demotions=int(self._end_demotions[i]),
                        view=None if self._views is None else self._views[i])
                for i, s in enumerate(self._live)]

    def _gap_tool(self, i: int, k: int) -> str:
        return label_at(self.batch.gap_tools, i, k)

    def _tool_started(self, s: _Slot, now: float) -> float | None:
        """When the tool of the page's current gap started, if that is known by ``now``
        (the trace's tool_start event time); None when the workload has no tool times."""
        b = self.batch
        if not b.gap_tool_start:
            return None
        starts, k = b.gap_tool_start[s.view.page_id], s.next_access
        started = float(starts[k]) if k < len(starts) else float("nan")
        return started if started <= now else None  # nan (no tool): never

    def run(self, progress: Callable[[int], None] | None = None) -> BatchTrace:
        """Replay every event; ``progress(n)`` is told of pages produced, every
        ``PROGRESS_PAGES`` pages and once at the end (a trace is one long batch)."""
        queue, live = self._queue, self._live
        handlers = (self._on_create, self._on_access, self._on_eol, self._on_false,
                    self._on_prefetch)
        t = 0.0
        created = 0
        while queue:
            t, kind, _, page, token = queue.pop()
            handlers[kind](page, t, token)
            s = live[page]
            if s is not None:  # (a stale prefetch of a page already done finds none)
                if kind != CREATE and kind != PREFETCH:
                    s.due -= 1
                self._settle(s)
            if kind == CREATE and progress is not None:
                created += 1
                if created == PROGRESS_PAGES:
                    progress(created)
                    created = 0
        if created and progress is not None:
            progress(created)
        self.driver.finish(t)
        for s in live:
            if s is not None and s.unread_prefetch:
                self.trace.wasted_prefetch_bytes += s.unread_prefetch
        return self.trace

    # ------------------------------------------------------------ space
    def _make_room(self, need: int, now: float) -> bool:
        """Free ``need`` bytes of HBM through the policy; False if it cannot."""
        over = self.used + need - self.batch.capacity_bytes
        if over <= 0:
            return True
        victims = self.policy.select_victims(over, now)
        if not victims:
            self.trace.overflow_events += 1
            return False
        for pid in victims:
            self._demote(self._page(pid), now)
        return True

    def _demote(self, s: _Slot, now: float) -> None:
        d = self.driver.demote(s.view, now)
        # Planned while the page is still in HBM (the gap planner moves HBM pages).
        start = self.driver.prefetch_at(s.view, d, now, self._tool_started(s, now))
        self._to_lower(s, d)
        self.used -= s.view.size_bytes
        s.prefetch_token += 1
        if start is not None:
            self._queue.push_prefetch(max(start, now), s.view.page_id, s.prefetch_token)
            s.prefetch_due = s.prefetch_token
        self._settle(s)

    def _to_lower(self, s: _Slot, d: Demotion) -> None:
        """The page's bytes go to the lower tier in form ``d``: a demotion, or a write
        straight there when HBM has no room; both count in ``demoted_bytes``."""
        s.where, s.demotion = LOWER, d
        s.demotions += 1
        s.view.tier, s.view.codec = d.tier, d.codec
        self.trace.demoted_bytes += d.stored_bytes

    def _page(self, i: int) -> _Slot:
        s = self._live[i]
        assert s is not None, f"page {i} is done; no policy holds it"
        return s

    def _admit(self, s: _Slot, now: float) -> None:
        s.view.tier, s.view.codec = Tier.HBM, Codec.FULL
        self.used += s.view.size_bytes
        self.policy.on_insert(s.view, now)

    def _restore_ms(self, s: _Slot) -> float:
        d = s.demotion
        assert d is not None
        if d.codec is Codec.RECOMPUTE:  # the true re-prefill time, not the policy's estimate
            return float(self._recompute[s.view.page_id]) * 1e3
        ms = self.driver.restore_s(s.view, d) * 1e3
        if self._jitter:
            ms += float(self.batch.jitter_ms[s.view.page_id])
        return ms

    # ------------------------------------------------------------ handlers
    def _on_create(self, i: int, now: float, _token: int) -> None:
        s = self._produce(i)
        s.view.last_access = now
        self.driver.produced(s.view, now)
        if self._make_room(s.view.size_bytes, now):
            s.where = IN_HBM
            self._admit(s, now)
        else:  # no room at all: the page is written straight to the lower tier
            self._to_lower(s, self.driver.demote(s.view, now))

    def _on_prefetch(self, i: int, now: float, token: int) -> None:
        s = self._live[i]
        if s is None or token != s.prefetch_token:
            return
        s.prefetch_due = -1
        if s.where != LOWER:
            return
        if not self._room_for_prefetch(s, now):
            return
        d = s.demotion
        assert d is not None
        start = max(now, self.link_free_at)
        ms = self._restore_ms(s)
        self.link_free_at = start + ms / 1e3
        s.where, s.ready_at, s.restore_ms = PREFETCHING, start + ms / 1e3, ms
        s.view.tier, s.view.codec = Tier.HBM, Codec.FULL
        self.used += s.view.size_bytes
        self.trace.transfer_bytes += d.stored_bytes
        s.unread_prefetch += d.stored_bytes

    def _room_for_prefetch(self, s: _Slot, now: float) -> bool:
        """Ask the policy whether the landing page may displace residents (and whom)."""
        view = s.view
        over = self.used + view.size_bytes - self.batch.capacity_bytes
        admission = self.driver.admit_prefetch(view, max(0, over), now)
        if not admission.admitted:
            return False
        for pid in admission.victims:
            self._demote(self._page(pid), now)
        return True

    def _on_access(self, i: int, now: float, _token: int) -> None:
        s = self._page(i)
        retype_due(self.batch, self.driver, s.view, now)
        tr = self.trace
        view = s.view
        risk = wrong = 0.0
        weight = float(self._weight[i])
        if s.where == IN_HBM:
            hit, visible, total = True, 0.0, 0.0
            self.policy.on_access(view, now)
        elif s.where == RETIRED:  # freed on a false signal: re-prefill from scratch
            hit = False
            total = visible = float(self._recompute[i]) * 1e3
            tr.false_signal_reads += 1
            tr.false_signal_ms += total
            view.dependency = 1.0
            if self._make_room(view.size_bytes, now):
                s.where = IN_HBM
                self._admit(s, now)
            else:  # re-prefilled with no room: written straight to the lower tier
                self._to_lower(s, self.driver.demote(view, now))
        else:
            hit = False
            d = s.demotion
            assert d is not None
            risk = risk_of_read(weight, d, view.predicted_idle_s, now - view.last_access)
            wrong = wrong_eviction_weight(weight, d)
            if s.where == PREFETCHING:
                s.unread_prefetch = 0
                total = s.restore_ms
                visible = max(0.0, (s.ready_at - now) * 1e3)
                s.where = IN_HBM
                self.policy.on_access(view, now)
            else:
                s.prefetch_token += 1  # cancel the planned prefetch: the read came first
                start = max(now, self.link_free_at)
                ms = self._restore_ms(s)
                self.link_free_at = start + ms / 1e3
                total = ms
                visible = (start - now) * 1e3 + ms
                tr.transfer_bytes += d.stored_bytes
                if self._make_room(view.size_bytes, now):
                    s.where = IN_HBM
                    self._admit(s, now)
        tr.access_bytes.append(view.size_bytes)
        tr.access_hit.append(hit)
        tr.access_visible_ms.append(visible)
        tr.access_restore_ms.append(total)
        tr.access_risk.append(risk)
        tr.access_weight.append(weight)
        tr.access_wrong.append(wrong)
        b = self.batch
        k = s.next_access
        tool_s = float(b.gap_tool_s[i][k]) if b.gap_tool_s and k < len(b.gap_tool_s[i]) else 0.0
        self.driver.observe_read(view, now - view.last_access, tool_s, now)
        self._after_read(s, now)

    def _after_read(self, s: _Slot, now: float) -> None:
        view = s.view
        s.next_access += 1
        view.last_access = now
        view.access_count += 1
        gaps = self.batch.predicted_idle[view.page_id]
        if s.next_access < len(gaps):
            view.predicted_idle_s = float(gaps[s.next_access])
        self.driver.enter_gap(view, self._gap_tool(view.page_id, s.next_access), now)
        if s.where == IN_HBM:
            self.policy.on_update(view, now)

    def _on_eol(self, i: int, now: float, _token: int) -> None:
        # The orchestrator reports the page's end of life (task end, branch abandoned,
        # version superseded): the dependency weight drops to 0 and the policy decides
        # whether the page is retired from every tier.
        s = self._page(i)
        if s.where in (RETIRED, NOT_YET):
            return
        s.view.dependency = 0.0
        retype_due(self.batch, self.driver, s.view, now)
        self.driver.observe_end(s.view, now)
        signal = SIGNAL_ORDER[int(self._kinds[i])]
        decision = self.policy.on_consumers_done(s.view, now, signal=signal)
        if not decision.retire:
            return
        if s.where in (IN_HBM, PREFETCHING):
            self.used -= s.view.size_bytes
        if s.unread_prefetch:
            self.trace.wasted_prefetch_bytes += s.unread_prefetch
            s.unread_prefetch = 0
        s.where = RETIRED
        s.prefetch_token += 1
        self.trace.retired_pages += 1

    def _on_false(self, i: int, now: float, token: int) -> None:
        # Indistinguishable from a true signal to the policy; only a later read tells.
        self._on_eol(i, now, token)
