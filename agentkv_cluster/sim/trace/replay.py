"""Trace events -> one simulator timeline (no hindsight).

The whole trace (or its first ``sessions`` sessions by start time, each kept
whole) is ONE batch: every session shares one HBM budget and one host link over
time, as they would on one server. A page is one KV block (``block_tokens``
tokens of ``kv_bytes_per_token``); equal block ids are the same KV, so a block
held by several sessions is a shared prefix (FIXED_PREFIX). The first model call
holding a block produces it; every later model call holding it reads it, each
call counted, also when several calls read it at the same instant.

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
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.trace.conflicts import find_conflicts
from agentkv_cluster.sim.trace.format import TraceEvent, TraceFormatError
from agentkv_cluster.sim.trace.tasks import split_tasks
from agentkv_cluster.sim.workload import TYPE_ORDER, Batch, Workload, noise_rng

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
    name: str
    calls: list[TraceEvent]
    tools: list[TraceEvent]
    tool_ts: list[float]
    call_ts: list[float]
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
        ("", 0) for none."""
        k = bisect.bisect_left(self.call_ts, call_ts)
        if k == 0:
            return "", 0.0
        lo = self.call_ts[k - 1]
        i = bisect.bisect_left(self.tool_ts, lo)
        j = bisect.bisect_left(self.tool_ts, call_ts)
        if i >= j:
            return "", 0.0
        tools = self.tools[i:j]
        return tools[-1].tool_class, min(sum(t.tool_duration_s for t in tools), call_ts - lo)

    def tool_after(self, call_ts: float) -> str:
        """The tool this session starts after its call at ``call_ts`` (the first one
        before its next call), known once the call is done; "" for none (a final answer).
        Whether a later call follows plays no part."""
        k = bisect.bisect_right(self.call_ts, call_ts)
        hi = self.call_ts[k] if k < len(self.call_ts) else float("inf")
        i = bisect.bisect_left(self.tool_ts, call_ts)
        if i < len(self.tools) and self.tool_ts[i] < hi:
            return self.tools[i].tool_class
        return ""


def sessions_of(events: Sequence[TraceEvent]) -> list[_Session]:
    """One ``_Session`` per task with a model call, by first call; a session name reused
    after its ``task_end`` gives one per task (``tasks.split_tasks``). A ``task_end`` that
    ends no task, a repeated ``tool_start`` and a block given two sizes
    (``conflicts.find_conflicts``) are a ``TraceFormatError`` (the parser reports each
    as a line error)."""
    conflicts = find_conflicts(events)
    if conflicts:
        raise TraceFormatError(f"{len(conflicts)} event(s) contradict an earlier one; "
                               f"first: event {conflicts[0].index + 1}: {conflicts[0].reason}")
    split = split_tasks(events)
    if split.strays:
        raise TraceFormatError(f"{len(split.strays)} task_end event(s) end no task; "
                               f"first: {split.strays[0].reason}")
    by: dict[str, _Session] = {}
    for e, task in zip(events, split.tasks, strict=True):
        s = by.get(task)
        if s is None:
            s = by[task] = _Session(task, [], [], [], [], e.ts, None)
        s.last_event = max(s.last_event, e.ts)
        if e.kind == "model_call":
            s.calls.append(e)
        elif e.kind == "tool_start":
            s.tools.append(e)
            s.last_event = max(s.last_event, e.ts + e.tool_duration_s)
        elif e.kind == "task_end":
            s.task_end = e.ts
    out = [s for s in by.values() if s.calls]
    for s in out:
        s.calls.sort(key=lambda e: e.ts)
        s.tools.sort(key=lambda e: e.ts)
        s.tool_ts = [t.ts for t in s.tools]
        s.call_ts = [c.ts for c in s.calls]
    out.sort(key=lambda s: (s.calls[0].ts, s.name))
    return out


@dataclass(slots=True)
class _Page:
    block: int
    tokens: int
    created: float
    state: StateType
    owner: str
    reads: list[tuple[float, str]]  # (time, reading session)
    holders: set[str]


def _pages(sessions: list[_Session]) -> list[_Page]:
    calls = sorted(((c.ts, s.name, k, c) for s in sessions for k, c in enumerate(s.calls)),
                   key=lambda x: (x[0], x[1], x[2]))
    pages: dict[int, _Page] = {}
    for ts, name, k, call in calls:
        state = call.state or (StateType.TASK_INPUT if k == 0 else StateType.TOOL_OBSERVATION)
        for b in dict.fromkeys(call.prefix_blocks):  # a block once per call
            p = pages.get(b)
            if p is None:
                pages[b] = _Page(b, call.block_tokens, ts, state, name, [], {name})
            else:
                p.reads.append((ts, name))
                p.holders.add(name)
    return sorted(pages.values(), key=lambda p: (p.created, p.block))


def _signal_time(p: _Page, ends: dict[str, float]) -> float:
    """When every session that held the block up to then has ended (no lookahead):
    walk the holders in order of first use; the signal is the first moment the
    holders seen so far are all over before the next holder appears."""
    first_use: dict[str, float] = {p.owner: p.created}
    for t, s in p.reads:
        first_use.setdefault(s, t)
    order = sorted(first_use.items(), key=lambda x: x[1])
    done = ends[order[0][0]]
    for s, t in order[1:]:
        if t > done:
            return done  # all earlier holders had ended: the orchestrator said so then
        done = max(done, ends[s])
    return done


def working_set_bytes(batch: Batch) -> int:
    """Peak bytes of pages live at once (production to last read)."""
    last = np.array([float(r[-1]) if len(r) else float(c)
                     for r, c in zip(batch.access_times, batch.created)])
    t = np.concatenate([batch.created, last])
    delta = np.concatenate([batch.sizes, -batch.sizes])
    order = np.lexsort((-delta, t))  # at equal times, add before removing
    return int(np.cumsum(delta[order]).max()) if len(t) else 0


def _batch(pages: list[_Page], sessions: list[_Session], cfg: SimConfig,
           rc: ReplayConfig) -> Batch:
    n = len(pages)
    by = {s.name: s for s in sessions}
    ends = {s.name: s.end(rc) for s in sessions}
    rng = np.random.Generator(np.random.PCG64([cfg.seed, 0x7EACE]))
    nrng = noise_rng(cfg.seed, cfg.noise)
    types = np.array([TYPE_ORDER.index(StateType.FIXED_PREFIX if len(p.holders) > 1
                                       else p.state) for p in pages], dtype=np.int8)
    sizes = np.array([p.tokens * rc.kv_bytes_per_token for p in pages], dtype=np.int64)
    created = np.array([p.created for p in pages])
    eol = np.array([_signal_time(p, ends) for p in pages])
    access, predicted, gap_tools, gap_tool_s = [], [], [], []
    all_gaps = [t2 - t1 for p in pages
                for t1, t2 in zip([p.created] + [t for t, _ in p.reads], [t for t, _ in p.reads])]
    typical = float(np.median(all_gaps)) if all_gaps else 1.0
    for i, p in enumerate(pages):
        times = [p.created] + [t for t, _ in p.reads]
        readers = [s for _, s in p.reads]
        # each gap's label: the tool its opening session starts right after the call
        # that opened it (known at the gap's start); its duration: what the reading
        # call waited on (learned only at the read)
        tools = [by[s].tool_after(t) for s, t in zip([p.owner, *readers], times, strict=True)]
        secs = [by[s].tool_before(times[k + 1])[1] for k, s in enumerate(readers)]
        gaps = np.diff(times)
        # After the last read there is no true gap to add noise to, and the time to the
        # signal (an idle timeout away) would tell the predictor the page is dead: the
        # guess is a typical gap instead (the page's own median so far, else the trace's).
        tail = float(np.median(gaps)) if gaps.size else typical
        true = np.maximum(np.append(gaps, tail), 1e-3)
        access.append(np.asarray(times[1:], dtype=np.float64))
        predicted.append(true * np.exp(cfg.noise * nrng.standard_normal(true.size)))
        gap_tools.append(tuple(tools))
        gap_tool_s.append(np.asarray([*secs, 0.0], dtype=np.float64))
    rate = np.array([cfg.workload.types[t].recompute_ms_per_mb for t in TYPE_ORDER]) / 1e3
    weight = np.array([cfg.workload.types[t].correctness_weight for t in TYPE_ORDER])
    recompute = sizes / MB * rate[types]
    batch = Batch(
        index=0, capacity_bytes=1, types=types, sizes=sizes, created=created, eol=eol,
        access_times=tuple(access), predicted_idle=tuple(predicted),
        jitter_ms=rng.exponential(cfg.link.jitter_mean_ms, size=n),
        sessions=tuple(p.owner for p in pages),
        tool_classes=tuple(t[0] for t in gap_tools),
        recompute_s=recompute,
        recompute_est_s=recompute * np.exp(cfg.cost_error * nrng.standard_normal(n)),
        correctness=weight[types], gap_tools=tuple(gap_tools), gap_tool_s=tuple(gap_tool_s))
    return dataclasses.replace(
        batch, capacity_bytes=max(1, int(cfg.budget * working_set_bytes(batch))))


def replay_workload(events: Sequence[TraceEvent], cfg: SimConfig, source: str,
                    rc: ReplayConfig | None = None) -> Workload:
    """One timeline for ``events``; raises TraceFormatError when there is no model call."""
    rc = rc or ReplayConfig()
    sessions = sessions_of(events)
    if not sessions:
        raise TraceFormatError(f"{source}: no model_call events to replay")
    sessions = sessions[rc.skip:]
    if rc.sessions is not None:
        sessions = sessions[: rc.sessions]
    if not sessions:
        raise TraceFormatError(f"{source}: no session left after skipping {rc.skip}")
    pages = _pages(sessions)
    if not pages:
        raise TraceFormatError(f"{source}: no KV block to replay (every model_call of the "
                               f"{len(sessions)} session(s) has an empty prefix_blocks)")
    return Workload(source=source, batches=[_batch(pages, sessions, cfg, rc)],
                    sessions=len(sessions))


def reads_per_type(workload: Workload) -> dict[str, int]:
    """How many reads each state type gets (printed with replay results)."""
    counts: dict[str, int] = defaultdict(int)
    for b in workload:
        for i in range(b.n_pages):
            counts[TYPE_ORDER[int(b.types[i])].value] += len(b.access_times[i])
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
