"""Trace events -> one simulator timeline (no hindsight).

The whole trace (or its first ``sessions`` sessions by start time, each kept
whole) is ONE batch: every session shares one HBM budget and one host link over
time, as they would on one server. A page is one KV block (``block_tokens``
tokens of ``kv_bytes_per_token``); equal block ids are the same KV. A block is
produced with its producer's state and becomes a shared prefix (FIXED_PREFIX) at
the first read by another session, never before: the policies see the change
then (``Batch.retype_at``), as the service sees a prefix lookup adopt a page. (The
type was FIXED_PREFIX from production for any block a later session would read:
hindsight that the type-aware policies used.) The first model call holding a
block produces it; every later model call holding it reads it, each call
counted, also when several calls read it at the same instant.

End of life comes only from events in the trace, at their own time:

- a session (one task: a name reused after its ``task_end`` is a new session,
  ``tasks.py``) ends at its own ``task_end`` event, or, when it simply stops, once
  it has been silent for ``idle_timeout_s`` (what an orchestrator that never hears
  from it again would conclude);
- a block's signal (TASK_END) fires when every session that has held it *so far*
  has ended. A later session that reads it again finds it freed by any policy
  that acted on the signal and pays a recompute (the simulator counts it), as a
  real cache would. Nothing looks at later sessions.

Each idle gap of a page (between two reads, from production to the first, or
after the last) is labelled, at its start, with the tool the session that
touched the page starts after that call (its first ``tool_start`` before its
next call; "" for a final answer): never with anything that depends on whether
a later call comes. The trace's own ``tool_duration_s`` of the tools the reading
call waited on (summed when it ran several) is learned at the read. The predictor learns those tool durations and the gap planner
plans from the tool start; predictions of gap lengths are the true gap times a
log-normal error (``noise``), drawn per noise level, as in the synthetic
workloads. The gap after a page's last read has no true length; its prediction
is a typical gap (the page's own median gap, else the trace's) with the same
error, never the time to its signal (that would tell every policy the page is
dead). HBM capacity is ``budget`` x the peak bytes of blocks live at once
(a block is live from its production to its last read).

The arithmetic runs on the trace's columns (``timeline.py``) and the batch holds
its per-page arrays as ``Ragged`` columns: no object per request, page or read.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.trace import timeline
from agentkv_cluster.sim.trace.conflicts import find_conflicts
from agentkv_cluster.sim.trace.format import TraceEvent, TraceFormatError
from agentkv_cluster.sim.trace.table import EventTable
from agentkv_cluster.sim.trace.tasks import TaskSplit, split_tasks
from agentkv_cluster.sim.workload import (
    TYPE_ORDER,
    Batch,
    Ragged,
    RaggedLabels,
    Workload,
    noise_rng,
)

LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K+V, 32 layers, 8 KV heads, d 128, fp16
DEFAULT_IDLE_TIMEOUT_S = 300.0


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    kv_bytes_per_token: int = LLAMA3_8B_KV_BYTES_PER_TOKEN
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    sessions: int | None = None  # first N sessions by start time (whole); None = all
    skip: int = 0  # sessions skipped before them (a held-out part of the trace)

    def __post_init__(self) -> None:
        if not (self.idle_timeout_s > 0 and math.isfinite(self.idle_timeout_s)):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, "
                             f"got {self.idle_timeout_s}")
        if self.sessions is not None and self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        if self.skip < 0:
            raise ValueError(f"skip must be >= 0, got {self.skip}")


@dataclass(slots=True)
class _Session:
    """One task's events (its calls and tools in time order), for readers of sessions."""

    name: str
    calls: list[TraceEvent]
    tools: list[TraceEvent]
    last_event: float
    task_end: float | None

    def end(self, rc: ReplayConfig) -> float:
        """When the session is known to be over: its task_end, else silence timeout."""
        if self.task_end is not None:
            return self.task_end
        return self.last_event + rc.idle_timeout_s

    def tool_before(self, call_ts: float) -> tuple[str, float]:
        """The tool this session's call at ``call_ts`` waited on: the tools started at
        or after its previous call and before this one (last class, summed seconds);
        ("", 0) for none. (``timeline`` computes the same for every call at once.)"""
        call_ts_all = [c.ts for c in self.calls]
        tool_ts = [t.ts for t in self.tools]
        k = bisect.bisect_left(call_ts_all, call_ts)
        if k == 0:
            return "", 0.0
        lo = call_ts_all[k - 1]
        tools = self.tools[bisect.bisect_left(tool_ts, lo):bisect.bisect_left(tool_ts, call_ts)]
        if not tools:
            return "", 0.0
        return tools[-1].tool_class, min(sum(t.tool_duration_s for t in tools), call_ts - lo)


def _checked(events: Sequence[TraceEvent]) -> tuple[EventTable, TaskSplit]:
    """The events as columns and their tasks; a ``task_end`` that ends no task, a
    repeated ``tool_start`` and a block given two sizes (``conflicts.find_conflicts``)
    are a ``TraceFormatError`` (the parser reports each as a line error)."""
    table = EventTable.from_events(events)
    conflicts = find_conflicts(table)
    if conflicts:
        raise TraceFormatError(f"{len(conflicts)} event(s) contradict an earlier one; "
                               f"first: event {conflicts[0].index + 1}: {conflicts[0].reason}")
    split = split_tasks(table)
    if split.strays:
        raise TraceFormatError(f"{len(split.strays)} task_end event(s) end no task; "
                               f"first: {split.strays[0].reason}")
    return table, split


def sessions_of(events: Sequence[TraceEvent]) -> list[_Session]:
    """One ``_Session`` per task with a model call, by first call; a session name reused
    after its ``task_end`` gives one per task (``tasks.split_tasks``). Errors as
    ``replay_workload``'s."""
    table, split = _checked(events)
    tasks = timeline.tasks_of(table.columns(), split)
    order = tasks.with_calls()
    where = {t: k for k, t in enumerate(order)}
    out = [_Session(tasks.names[t], [], [], float(tasks.last_event[t]),
                    None if math.isnan(tasks.task_end[t]) else float(tasks.task_end[t]))
           for t in order]
    for i, t in enumerate(split.codes.tolist()):
        k = where.get(t)
        kind = table.kind_of(i)
        if k is not None and kind in ("model_call", "tool_start"):
            (out[k].calls if kind == "model_call" else out[k].tools).append(table[i])
    for s in out:
        s.calls.sort(key=lambda e: e.ts)
        s.tools.sort(key=lambda e: e.ts)
    return out


def working_set_bytes(batch: Batch) -> int:
    """Peak bytes of pages live at once (production to last read)."""
    reads = batch.access_times
    if isinstance(reads, Ragged):
        counts = np.diff(reads.offsets)
        last = batch.created.astype(np.float64)
        last[counts > 0] = reads.values[reads.offsets[1:][counts > 0] - 1]
    else:
        last = np.array([float(r[-1]) if len(r) else float(c)
                         for r, c in zip(reads, batch.created)])
    t = np.concatenate([batch.created, last])
    delta = np.concatenate([batch.sizes, -batch.sizes])
    order = np.lexsort((-delta, t))  # at equal times, add before removing
    return int(np.cumsum(delta[order]).max()) if len(t) else 0


def _batch(table: EventTable, split: TaskSplit, tasks: timeline.Tasks, chosen: list[int],
           cfg: SimConfig, rc: ReplayConfig) -> Batch | None:
    """The one batch of the ``chosen`` tasks; None when their calls hold no block."""
    c = table.columns()
    calls = timeline.calls_of(c, split, tasks, chosen)
    pages = timeline.pages_of(c, calls)
    n = pages.block.size
    if not n:
        return None
    rng = np.random.Generator(np.random.PCG64([cfg.seed, 0x7EACE]))
    nrng = noise_rng(cfg.seed, cfg.noise)
    types, shared_at = timeline.page_types(pages, calls)
    sizes = c.block_tokens[calls.event[pages.first_call]] * rc.kv_bytes_per_token
    created = calls.ts[pages.first_call]
    eol = timeline.signal_times(pages, calls, tasks.ends(rc.idle_timeout_s))
    gaps = timeline.gaps_of(pages, calls, c.names)
    predicted = gaps.true * np.exp(cfg.noise * nrng.standard_normal(gaps.true.size))
    owner = calls.task[pages.first_call]
    rate = np.array([cfg.workload.types[t].recompute_ms_per_mb for t in TYPE_ORDER]) / 1e3
    weight = np.array([cfg.workload.types[t].correctness_weight for t in TYPE_ORDER])
    recompute = sizes / MB * rate[types]
    batch = Batch(
        index=0, capacity_bytes=1, types=types, sizes=sizes, created=created, eol=eol,
        access_times=Ragged(gaps.read_ts, pages.offsets),
        predicted_idle=Ragged(predicted, gaps.offsets),
        jitter_ms=rng.exponential(cfg.link.jitter_mean_ms, size=n),
        sessions=tuple(tasks.names[t] for t in owner.tolist()),
        tool_classes=tuple(gaps.names[k] for k in gaps.labels[gaps.head].tolist()),
        recompute_s=recompute,
        recompute_est_s=recompute * np.exp(cfg.cost_error * nrng.standard_normal(n)),
        correctness=weight[types],
        gap_tools=RaggedLabels(Ragged(gaps.labels, gaps.offsets), gaps.names),
        gap_tool_s=Ragged(gaps.secs, gaps.offsets),
        gap_tool_start=Ragged(gaps.starts, gaps.offsets),
        retype_at=shared_at, retype_to=np.full(n, timeline.FIXED, np.int8))
    return dataclasses.replace(
        batch, capacity_bytes=max(1, int(cfg.budget * working_set_bytes(batch))))


def replay_workload(events: Sequence[TraceEvent], cfg: SimConfig, source: str,
                    rc: ReplayConfig | None = None) -> Workload:
    """One timeline for ``events``; raises TraceFormatError when there is no model call."""
    rc = rc or ReplayConfig()
    table, split = _checked(events)
    tasks = timeline.tasks_of(table.columns(), split)
    order = tasks.with_calls()
    if not order:
        raise TraceFormatError(f"{source}: no model_call events to replay")
    chosen = order[rc.skip:]
    if rc.sessions is not None:
        chosen = chosen[: rc.sessions]
    if not chosen:
        raise TraceFormatError(f"{source}: no session left after skipping {rc.skip}")
    batch = _batch(table, split, tasks, chosen, cfg, rc)
    if batch is None:
        raise TraceFormatError(f"{source}: no KV block to replay (every model_call of the "
                               f"{len(chosen)} session(s) has an empty prefix_blocks)")
    return Workload(source=source, batches=[batch], sessions=len(chosen))


def reads_per_type(workload: Workload) -> dict[str, int]:
    """How many reads each state type gets, by the page's type at the read (printed
    with replay results)."""
    counts: dict[str, int] = defaultdict(int)
    for b in workload:
        for i in range(b.n_pages):
            reads = np.asarray(b.access_times[i])
            later = 0 if b.retype_at is None or b.retype_to is None else \
                int(np.count_nonzero(reads >= b.retype_at[i]))
            if reads.size > later:
                counts[TYPE_ORDER[int(b.types[i])].value] += reads.size - later
            if later:
                counts[TYPE_ORDER[int(b.retype_to[i])].value] += later
    return dict(counts)


def describe(workload: Workload) -> str:
    pages = sum(b.n_pages for b in workload)
    reads = sum(len(r) for b in workload for r in b.access_times)
    # a workload built by hand has no session count: the sessions that own a block
    sessions = (workload.sessions if workload.sessions is not None
                else len({s for b in workload for s in b.sessions}))
    cap = sum(b.capacity_bytes for b in workload) / MB
    return (f"one timeline: {sessions} sessions, {pages} blocks, {reads} reads, "
            f"HBM {cap:,.0f} MB shared; reads by type {reads_per_type(workload)}")
