"""Trace events -> the simulator's batches.

A page is one KV block (``block_tokens`` tokens of ``kv_bytes_per_token``).
It is produced by the first model call whose context holds it and read by every
later call of the batch that holds it again. Blocks held by several sessions
are fixed prefixes; otherwise a block takes the ``state`` of the call that
introduced it. Consecutive sessions (by start time) are grouped into batches of
about ``pages_per_batch`` distinct blocks; each batch is an independent working
set whose HBM budget is a fraction of its bytes, as in the synthetic workload.
The predictor's idle-time guess is the true gap times exp(noise * N(0, 1)); the
end-of-life signal of a block arrives when the last session holding it ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.trace.format import TraceEvent, TraceFormatError
from agentkv_cluster.sim.workload import TYPE_ORDER, Batch, Workload

LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K+V, 32 layers, 8 KV heads, d 128, fp16


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    kv_bytes_per_token: int = LLAMA3_8B_KV_BYTES_PER_TOKEN
    pages_per_batch: int = 64


@dataclass(slots=True)
class _Session:
    name: str
    calls: list[TraceEvent]
    tools: list[TraceEvent]
    end: float


def _sessions(events: Sequence[TraceEvent]) -> list[_Session]:
    by: dict[str, _Session] = {}
    for e in events:
        s = by.get(e.session)
        if s is None:
            s = by[e.session] = _Session(e.session, [], [], e.ts)
        s.end = max(s.end, e.ts)
        if e.kind == "model_call":
            s.calls.append(e)
        elif e.kind == "tool_start":
            s.tools.append(e)
            s.end = max(s.end, e.ts + e.tool_duration_s)
    out = [s for s in by.values() if s.calls]
    for s in out:
        s.calls.sort(key=lambda e: e.ts)
        s.tools.sort(key=lambda e: e.ts)
    out.sort(key=lambda s: (s.calls[0].ts, s.name))
    return out


def _group(sessions: list[_Session], target: int) -> list[list[_Session]]:
    groups: list[list[_Session]] = []
    current: list[_Session] = []
    blocks: set[int] = set()
    for s in sessions:
        current.append(s)
        for c in s.calls:
            blocks.update(c.prefix_blocks)
        if len(blocks) >= target:
            groups.append(current)
            current, blocks = [], set()
    if current:
        groups.append(current)
    return groups


@dataclass(slots=True)
class _Page:
    block: int
    tokens: int
    reads: list[float]
    sessions: set[str]
    state: StateType
    session: str
    tool: str
    eol: float


def _pages(group: list[_Session]) -> list[_Page]:
    pages: dict[int, _Page] = {}
    for s in group:
        for k, call in enumerate(s.calls):
            tool = ""
            for t in s.tools:  # the tool whose return this call waited on
                if t.ts <= call.ts:
                    tool = t.tool_class
            state = call.state or (StateType.TASK_INPUT if k == 0 else StateType.TOOL_OBSERVATION)
            for b in call.prefix_blocks:
                p = pages.get(b)
                if p is None:
                    pages[b] = _Page(b, call.block_tokens, [call.ts], {s.name}, state,
                                     s.name, tool, s.end)
                    continue
                p.reads.append(call.ts)
                p.sessions.add(s.name)
                p.eol = max(p.eol, s.end)
                p.tool = tool or p.tool
    for p in pages.values():  # sessions interleave in time: order and dedupe the reads
        p.reads = sorted(set(p.reads))
    return sorted(pages.values(), key=lambda p: (p.reads[0], p.block))


def _batch(index: int, pages: list[_Page], cfg: SimConfig, rc: ReplayConfig,
           rng: np.random.Generator) -> Batch:
    n = len(pages)
    types = np.array([TYPE_ORDER.index(StateType.FIXED_PREFIX if len(p.sessions) > 1
                                       else p.state) for p in pages], dtype=np.int8)
    sizes = np.array([p.tokens * rc.kv_bytes_per_token for p in pages], dtype=np.int64)
    created = np.array([p.reads[0] for p in pages])
    access, predicted = [], []
    for p in pages:
        t = np.asarray(p.reads, dtype=np.float64)
        gaps = np.diff(t)
        tail = gaps[-1:] if gaps.size else np.array([max(p.eol - t[0], 1.0)])
        actual = np.concatenate([gaps, tail])
        noise = np.exp(cfg.noise * rng.standard_normal(actual.size))
        access.append(t[1:])
        predicted.append(np.maximum(actual, 1e-3) * noise)
    eol = np.array([max(p.eol, p.reads[-1]) for p in pages])
    jitter = rng.exponential(cfg.link.jitter_mean_ms, size=n)
    return Batch(
        index=index, capacity_bytes=int(cfg.budget * int(sizes.sum())), types=types,
        sizes=sizes, created=created, eol=eol, access_times=tuple(access),
        predicted_idle=tuple(predicted), jitter_ms=jitter,
        sessions=tuple(p.session for p in pages), tool_classes=tuple(p.tool for p in pages))


def replay_workload(events: Sequence[TraceEvent], cfg: SimConfig, source: str,
                    rc: ReplayConfig | None = None) -> Workload:
    """Batches for ``events``; raises TraceFormatError when there is no model call."""
    rc = rc or ReplayConfig()
    sessions = _sessions(events)
    if not sessions:
        raise TraceFormatError(f"{source}: no model_call events to replay")
    rng = np.random.Generator(np.random.PCG64(cfg.seed))
    batches = [_batch(i, _pages(g), cfg, rc, rng)
               for i, g in enumerate(_group(sessions, rc.pages_per_batch))]
    return Workload(source=source, batches=batches)


def reads_per_type(workload: Workload) -> dict[str, int]:
    """How many reads each state type gets (printed with replay results)."""
    counts: dict[str, int] = defaultdict(int)
    for b in workload:
        for i in range(b.n_pages):
            counts[TYPE_ORDER[int(b.types[i])].value] += len(b.access_times[i])
    return dict(counts)
