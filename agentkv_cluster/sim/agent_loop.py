"""The agent-loop workload preset: real agent loops re-read their whole context.

Each batch holds ``sessions_per_batch`` concurrent sessions sharing one HBM
budget (a fraction of the batch's bytes, as in the paper preset). A session is a
chain of model calls; between two calls the model generates (log-normal
latency) and then one tool runs (a tool class drawn per gap, with its own
log-normal duration). Every model call reads every live page of its session,
the shared system-prompt prefix included, so most pages are read many times
until the task ends. Each call adds a tool-observation (or evidence) page and a
reasoning page. Lifecycle, with the signal a real orchestrator sends:

- task end: at the session's last call every live page ends (TASK_END);
- branch abandoned: a reasoning page is dropped at the next call with
  probability ``abandon_prob`` (BRANCH_ABANDONED) and never read again; it
  becomes a FAILED_BRANCH then (``Batch.retype_at``), not at its production (its
  type told the type-aware policies from the start that it would be dropped);
- version superseded: an observation is replaced by a later one with
  probability ``supersede_prob`` at a later call (VERSION_SUPERSEDED).

The shared prefix ends when the last session of the batch ends. Each idle gap
carries its own tool class, the tool's own duration and its start (``Batch.gap_tools``,
``Batch.gap_tool_s``, ``Batch.gap_tool_start``); predictions are the true gap times a log-normal error
drawn from the noise stream, as in the paper preset.
"""

from __future__ import annotations

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.base import EndOfLife
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.workload import (
    SIGNAL_ORDER,
    TYPE_ORDER,
    Batch,
    Workload,
    noise_rng,
)

_T = {t: i for i, t in enumerate(TYPE_ORDER)}
_K = {k: i for i, k in enumerate(SIGNAL_ORDER)}


class _Pages:
    """Column builder for one batch."""

    def __init__(self) -> None:
        self.types: list[int] = []
        self.sizes: list[int] = []
        self.created: list[float] = []
        self.reads: list[list[float]] = []
        self.eol: list[float] = []
        self.kind: list[int] = []
        self.retype_at: list[float] = []
        self.retype_to: list[int] = []
        self.session: list[str] = []

    def add(self, st: StateType, size: int, created: float, session: str) -> int:
        self.types.append(_T[st])
        self.sizes.append(size)
        self.created.append(created)
        self.reads.append([])
        self.eol.append(np.inf)
        self.kind.append(_K[EndOfLife.TASK_END])
        self.retype_at.append(np.inf)
        self.retype_to.append(_T[st])
        self.session.append(session)
        return len(self.sizes) - 1


def _session(pages: _Pages, rng: np.random.Generator, cfg: SimConfig, name: str,
             t0: float, prefix: int) -> tuple[float, dict[int, list[tuple[str, float, float]]]]:
    """One session's calls; returns its end time and, per page, (tool, tool_s, tool
    start) per gap."""
    al = cfg.workload.agent_loop
    n_calls = int(rng.integers(al.calls_min, al.calls_max + 1))
    gaps: dict[int, list[tuple[str, float, float]]] = {}
    live: list[int] = []
    observations: list[int] = []

    def size() -> int:
        mb = np.clip(al.page_median_mb * np.exp(al.page_sigma * rng.standard_normal()),
                     1.0, 10 * al.page_median_mb)
        return int(mb * MB)

    t = t0
    live.append(pages.add(StateType.TASK_INPUT, size(), t, name))
    for k in range(n_calls):
        for p in (*live, prefix):  # the call reads the whole context so far
            if pages.created[p] < t:
                pages.reads[p].append(t)
        if k == n_calls - 1:
            break
        # the model answers (a reasoning page), then a tool runs, then the next call
        latency = al.model_median_s * np.exp(al.model_sigma * rng.standard_normal())
        tool = al.tools[int(rng.integers(len(al.tools)))]
        tool_s = tool.median_s * np.exp(tool.sigma * rng.standard_normal())
        reasoning = pages.add(StateType.TEMP_REASONING, size(), t + latency * 0.5, name)
        t_next = t + latency + tool_s
        obs_type = StateType.EVIDENCE if tool.name == "search" else StateType.TOOL_OBSERVATION
        obs = pages.add(obs_type, size(), t_next, name)
        for p in (*live, reasoning, prefix):
            gaps.setdefault(p, []).append((tool.name, float(tool_s), float(t + latency)))
        live.append(reasoning)
        # lifecycle at the next call: abandoned branches and superseded observations
        if rng.random() < al.abandon_prob:
            _end(pages, reasoning, t_next, EndOfLife.BRANCH_ABANDONED, StateType.FAILED_BRANCH)
            live.remove(reasoning)
        if observations and rng.random() < al.supersede_prob:
            old = observations.pop(int(rng.integers(len(observations))))
            _end(pages, old, t_next, EndOfLife.VERSION_SUPERSEDED)
            live.remove(old)
        live.append(obs)
        observations.append(obs)
        t = t_next
    for p in live:
        _end(pages, p, t, EndOfLife.TASK_END)
    return t, gaps


def _end(pages: _Pages, p: int, t: float, kind: EndOfLife,
         becomes: StateType | None = None) -> None:
    pages.eol[p] = t
    pages.kind[p] = _K[kind]
    if becomes is not None:  # the orchestrator says so at the signal, not before
        pages.retype_at[p], pages.retype_to[p] = t, _T[becomes]


def agent_loop_workload(cfg: SimConfig) -> Workload:
    wl = cfg.workload
    al = wl.agent_loop
    rng = np.random.Generator(np.random.PCG64([cfg.seed, 0xA6E7]))
    nrng = noise_rng(cfg.seed, cfg.noise)
    types_cfg = [wl.types[t] for t in TYPE_ORDER]
    rate = np.array([p.recompute_ms_per_mb for p in types_cfg]) / 1e3
    weight_of = np.array([p.correctness_weight for p in types_cfg])
    batches = []
    for b in range(wl.batches):
        pages = _Pages()
        prefix = pages.add(StateType.FIXED_PREFIX, int(al.prefix_mb * MB), 0.0, "prefix")
        all_gaps: dict[int, list[tuple[str, float, float]]] = {}
        end = 0.0
        for s in range(al.sessions_per_batch):
            start = float(rng.uniform(0.0, 2.0 * al.model_median_s))
            t_end, gaps = _session(pages, rng, cfg, f"b{b}s{s}", start, prefix)
            end = max(end, t_end)
            for p, g in gaps.items():
                all_gaps.setdefault(p, []).extend(g)
        _end(pages, prefix, end, EndOfLife.TASK_END)
        n = len(pages.sizes)
        types = np.array(pages.types, dtype=np.int8)
        sizes = np.array(pages.sizes, dtype=np.int64)
        created = np.array(pages.created)
        reads = [np.array(sorted(r)) for r in pages.reads]
        recompute = sizes / MB * rate[types]
        predicted, gap_tools, gap_tool_s, gap_tool_start = [], [], [], []
        for i in range(n):
            times = np.concatenate([[created[i]], reads[i]])
            gaps_i = np.diff(times) if len(reads[i]) else np.empty(0)
            tail = max(pages.eol[i] - times[-1], 0.0) if np.isfinite(pages.eol[i]) else 1.0
            true = np.maximum(np.concatenate([gaps_i, [max(tail, 1e-3)]]), 1e-3)
            predicted.append(true * np.exp(cfg.noise * nrng.standard_normal(true.size)))
            g = all_gaps.get(i, [])
            # the prefix is shared: its gaps interleave the sessions' tools; keep by order
            tools = tuple(name for name, _, _ in g[: true.size])
            gap_tools.append(tools + ("",) * (true.size - len(tools)))
            secs = [d for _, d, _ in g[: true.size]]
            starts = [at for _, _, at in g[: true.size]]
            if i == prefix:  # a shared page waits on no single tool
                gap_tools[-1] = ("",) * true.size
                secs, starts = [], []
            gap_tool_s.append(np.array(secs + [0.0] * (true.size - len(secs))))
            gap_tool_start.append(np.array(starts + [np.nan] * (true.size - len(starts))))
        batches.append(Batch(
            index=b, capacity_bytes=int(np.floor(cfg.budget * sizes.sum())),
            types=types, sizes=sizes, created=created, eol=np.array(pages.eol),
            access_times=tuple(reads), predicted_idle=tuple(predicted),
            jitter_ms=rng.exponential(cfg.link.jitter_mean_ms, size=n),
            sessions=tuple(pages.session), tool_classes=tuple(t[0] if t else ""
                                                            for t in gap_tools),
            eol_kind=np.array(pages.kind, dtype=np.int8), recompute_s=recompute,
            recompute_est_s=recompute * np.exp(cfg.cost_error * nrng.standard_normal(n)),
            correctness=weight_of[types], gap_tools=tuple(gap_tools),
            gap_tool_s=tuple(gap_tool_s), gap_tool_start=tuple(gap_tool_start),
            retype_at=np.array(pages.retype_at),
            retype_to=np.array(pages.retype_to, dtype=np.int8)))
    return Workload(source=f"agent-loop(seed={cfg.seed})", batches=batches)
