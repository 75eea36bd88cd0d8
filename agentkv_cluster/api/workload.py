"""A synthetic agent workload replayed through the wire client (the demo and the benchmarks).

Each session is one agent episode: task start (fixed prefix + task input), then
``turns`` rounds of model call (evidence + draft pages) -> tool call (a real sleep,
log-normal per tool class) -> observation -> resume, where the engine loads every
live page and the service reports, per page, where it came from and how long the
engine waited. Sessions run concurrently, one client connection each.

With ``episodes`` (``episodes_from_trace``) each session replays one whole trace
session instead: its first model call's blocks, then per later call the tool it
waited on (the trace's class and time-scaled duration) and the call's new blocks
as observation pages, each page sized from the trace's tokens, scaled to the
demo's memory.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentkv_cluster.api.client import AgentKvClient, SessionClient
from agentkv_cluster.lifecycle.identity import PageIdentity

SESSION_TIMEOUT_S = 600.0  # one session's turns, after its stagger, before it counts as failed
DIAL_AT_ONCE = 16  # sessions connecting at once: half the server's default pre-auth per_source
TOOLS = {"search": 0.9, "compile": 1.8, "db": 0.6}  # median seconds (time-scaled)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    sessions: int = 12
    turns: int = 3
    seed: int = 7
    layers: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    tokens: tuple[int, ...] = (128, 256, 384)
    tool_sigma: float = 0.35
    stagger_s: float = 0.25
    think_s: float = 0.02
    tenant: str = "demo"
    model: str = "smollm2-135m"
    # Per session: the (tool class, seconds) of each tool call, e.g. from a trace; None =
    # drawn from TOOLS.
    tool_plan: tuple[tuple[tuple[str, float], ...], ...] | None = None
    # Whole trace sessions to replay (one per demo session); None = synthetic episodes.
    episodes: tuple[TraceEpisode, ...] | None = None
    charge_bytes: int = 0  # the service charges pages in units of this (arena page); 0 = exact
    # The engine takes exact KV only: every page is stored ``structured``, so the risk
    # controller keeps it FULL and no policy serves a lossy copy (like for like in bytes).
    exact: bool = False

    def page_bytes(self, tokens: int) -> int:
        return 2 * self.layers * self.kv_heads * tokens * self.head_dim * 2

    def charged(self, tokens: int) -> int:
        """What one page of ``tokens`` costs the HBM budget."""
        size = self.page_bytes(tokens)
        unit = self.charge_bytes
        return -(-size // unit) * unit if unit > 0 else size

    def resumes(self) -> int:
        """Resumes (tool returns) one run makes: the progress bar's total."""
        if self.episodes:
            return sum(len(e.steps) for e in self.episodes)
        return self.sessions * self.turns

    def working_set(self) -> int:
        """Bytes of every page one run stores (the HBM budget is a fraction of it)."""
        if self.episodes:
            return sum(self.charged(t) for e in self.episodes for t, _ in e.pages())
        return self.sessions * (2 + 3 * self.turns) * self.charged(256)

    def largest_session(self) -> int:
        if self.episodes:
            return max(sum(self.charged(t) for t, _ in e.pages()) for e in self.episodes)
        return (2 + 3 * self.turns) * self.charged(max(self.tokens))


@dataclass(frozen=True, kw_only=True)
class TraceStep:
    """One tool call of a trace session and the new context of the call it ended in."""

    tool: str
    tool_s: float  # time-scaled seconds
    tokens: tuple[int, ...]  # one page per new block, scaled tokens


@dataclass(frozen=True, kw_only=True)
class TraceEpisode:
    session: str
    first: tuple[tuple[int, str], ...]  # (tokens, state type) of the first call's pages
    steps: tuple[TraceStep, ...]

    def pages(self) -> list[tuple[int, str]]:
        return [*self.first, *((t, "tool_observation") for s in self.steps for t in s.tokens)]


@dataclass(slots=True)
class Access:
    session: str
    source: str
    delay_ms: float  # restore delay at prepare_load plus verification at complete_load
    hidden_ms: float
    nbytes: int
    exact: bool = True  # the bytes the engine got are the FULL-precision ones
    verified: bool = False  # a lossy working copy was replaced by its FULL reference


@dataclass(slots=True)
class Results:
    accesses: list[Access] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Episode:
    """One session's pages and events (deterministic per seed)."""

    def __init__(self, spec: WorkloadSpec, index: int, run: str) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed * 1000 + index)
        self.session = f"{run}-s{index}"
        self.version = 0
        self.next_pid = 0
        self.live: dict[int, bytes] = {}  # pid -> key
        self.sizes: dict[int, int] = {}

    def page(self, state_type: str, tokens: int | None = None) -> dict[str, Any]:
        s = self.spec
        tokens = self.rng.choice(s.tokens) if tokens is None else tokens
        pid = self.next_pid
        self.next_pid += 1
        ident = PageIdentity(model_version=s.model, adapter_version="", tokenizer_version="tok1",
                             rope_config="theta=1e4", tenant=s.tenant, session=self.session,
                             start=pid * 1024, end=pid * 1024 + tokens, event_version=1)
        gen = np.random.default_rng(self.rng.getrandbits(32))
        data = gen.standard_normal(s.page_bytes(tokens) // 2, dtype=np.float32)
        self.sizes[pid] = s.page_bytes(tokens)
        return {"page_id": pid, "identity": ident.pack(), "state_type": state_type,
                "data": data.astype(np.float16).tobytes(),
                "shape": [s.layers, s.kv_heads, tokens, s.head_dim], "structured": s.exact}

    def ev(self, **fields: Any) -> dict[str, Any]:
        self.version += 1
        return {"event_id": self.version, "task_id": "task", "version": self.version,
                "ts": time.time(), **fields}


def _store(sc: SessionClient, ep: _Episode, pages: list[dict[str, Any]]) -> None:
    keys = sc.store_pages(pages)
    for page, key in zip(pages, keys):
        ep.live[page["page_id"]] = key


def _resume(sc: SessionClient, ep: _Episode, results: Results) -> None:
    """The engine resumes: every live page into HBM (prepare_load), then its bytes
    (complete_load), where a lossy working copy is verified against its FULL reference.
    The verification's delay is part of the page's restore delay (like for like with a
    policy that only ever restores exact copies)."""
    pids = sorted(ep.live)
    keys = [ep.live[p] for p in pids]
    prep = sc.prepare_load(keys)
    done = sc.complete_load(prep["load_id"])["pages"]
    with results.lock:
        for pid, page, got in zip(pids, prep["pages"], done):
            verify_ms = float(got.get("verify_ms", 0.0))
            results.accesses.append(Access(
                session=ep.session, source=page["source"],
                delay_ms=page["delay_ms"] + verify_ms, hidden_ms=page["hidden_ms"],
                nbytes=ep.sizes[pid], exact=bool(got["exact"]),
                verified=bool(got.get("verify_bytes", 0))))
    sc.release(keys)


def run_trace_episode(client: AgentKvClient, spec: WorkloadSpec, index: int, run: str,
                      results: Results, tick: Callable[[], None]) -> None:
    """One whole trace session: first call, then tool -> observation -> resume per step."""
    assert spec.episodes is not None
    trace = spec.episodes[index]
    ep = _Episode(spec, index, run)
    sc = client.open_session(ep.session)
    time.sleep(index * spec.stagger_s)
    first = [ep.page(state, tokens) for tokens, state in trace.first]
    _store(sc, ep, first)
    prefix = [p["page_id"] for p in first if p["state_type"] == "fixed_prefix"]
    sc.event("task_start", **ep.ev(prefix_generation=1, prefix_pages=prefix,
                                   input_pages=[p["page_id"] for p in first
                                                if p["page_id"] not in prefix]))
    for k, step in enumerate(trace.steps):
        sc.event("model_call", **ep.ev(call_id=f"m{k}", consumes=sorted(ep.live), produces=[]))
        time.sleep(spec.think_s)
        sc.event("tool_start", **ep.ev(call_id=f"k{k}", tool=step.tool))
        time.sleep(step.tool_s)
        obs = [ep.page("tool_observation", t) for t in step.tokens]
        if obs:
            _store(sc, ep, obs)
        sc.event("observation_return", **ep.ev(
            call_id=f"k{k}", produces=[[p["page_id"], "tool_observation"] for p in obs]))
        _resume(sc, ep, results)
        tick()
    sc.event("task_end", **ep.ev())


def run_episode(client: AgentKvClient, spec: WorkloadSpec, index: int, run: str,
                results: Results, tick: Callable[[], None]) -> None:
    if spec.episodes:
        run_trace_episode(client, spec, index, run, results, tick)
        return
    ep = _Episode(spec, index, run)
    sc = client.open_session(ep.session)
    time.sleep(index * spec.stagger_s)
    _store(sc, ep, [ep.page("fixed_prefix"), ep.page("task_input")])
    sc.event("task_start", **ep.ev(prefix_generation=1, prefix_pages=[0], input_pages=[1]))
    for turn in range(spec.turns):
        new = [ep.page("evidence"), ep.page("temp_reasoning")]
        _store(sc, ep, new)
        sc.event("model_call", **ep.ev(call_id=f"m{turn}", consumes=sorted(set(ep.live) - {
            p["page_id"] for p in new}), produces=[[p["page_id"], p["state_type"]] for p in new]))
        time.sleep(spec.think_s)
        if spec.tool_plan:
            calls = spec.tool_plan[index % len(spec.tool_plan)]
            tool, gap = calls[turn % len(calls)]
        else:
            tool = ep.rng.choice(sorted(TOOLS))
            gap = TOOLS[tool] * float(np.exp(ep.rng.gauss(0.0, spec.tool_sigma)))
        sc.event("tool_start", **ep.ev(call_id=f"k{turn}", tool=tool))
        time.sleep(gap)
        obs = ep.page("tool_observation")
        _store(sc, ep, [obs])
        sc.event("observation_return", **ep.ev(call_id=f"k{turn}",
                                                produces=[[obs["page_id"], "tool_observation"]]))
        _resume(sc, ep, results)
        tick()
    sc.event("task_end", **ep.ev())


def run_workload(connect: Callable[[], AgentKvClient], spec: WorkloadSpec, run: str,
                 tick: Callable[[], None] = lambda: None) -> Results:
    """Run every session on its own thread and connection; returns per-page accesses."""
    results = Results()
    dialing = threading.BoundedSemaphore(DIAL_AT_ONCE)

    def one(i: int) -> None:
        try:
            with dialing:  # a few at a time: a burst of new connections from one address
                client = connect()  # meets the server's pre-auth limits (``per_source``)
                try:
                    client.hello()
                except BaseException:
                    client.close()
                    raise
            with client:
                run_episode(client, spec, i, run, results, tick)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            with results.lock:
                results.errors.append(f"session {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(spec.sessions)]
    for t in threads:
        t.start()
    for i, t in enumerate(threads):  # a session's own time: its stagger, then its turns
        t.join(i * spec.stagger_s + SESSION_TIMEOUT_S)
        if t.is_alive():  # never a figure from a run that is still going
            with results.lock:
                results.errors.append(f"session {i}: still running after "
                                      f"{SESSION_TIMEOUT_S:.0f} s past its start")
    return results


def episodes_from_trace(path: Any, fmt: str, sessions: int, *, memory_bytes: int,
                        max_page_bytes: int, max_session_bytes: int | None = None,
                        spec: WorkloadSpec | None = None,
                        median_s: float = 0.5, cap_s: float = 2.0
                        ) -> tuple[TraceEpisode, ...]:
    """The first ``sessions`` whole sessions of a trace (by start time) as demo episodes.

    Pages hold the trace's KV blocks: tokens from the trace, scaled by one factor so
    that the sample's bytes fit ``memory_bytes``, no block exceeds
    ``max_page_bytes`` (the demo's arena page) and no session exceeds
    ``max_session_bytes`` (a resume loads the whole session into HBM at once); the
    scaled blocks one call adds are packed into pages of up to ``max_page_bytes``
    (prefix and input blocks apart); tool durations are time-scaled so
    the median tool call lasts ``median_s`` (capped at ``cap_s``): the demo replays
    minutes of agent time in seconds. A gap with no tool in the trace (a user's
    think time) is replayed as a ``think`` call of the same scaled length.
    """
    from agentkv_cluster.sim.trace.convert import load_trace
    from agentkv_cluster.sim.trace.format import TraceFormatError
    from agentkv_cluster.sim.trace.replay import sessions_of

    spec = spec or WorkloadSpec()
    picked = sessions_of(load_trace(path, fmt).events)[:sessions]
    if not picked:
        raise TraceFormatError(f"{path}: no model_call events to replay")
    holders: dict[int, set[str]] = {}
    for s in picked:
        for c in s.calls:
            for b in c.prefix_blocks:
                holders.setdefault(b, set()).add(s.name)
    raw: list[tuple[str, list[tuple[int, str]], list[tuple[str, float, list[int]]]]] = []
    for s in picked:
        seen: set[int] = set()
        first: list[tuple[int, str]] = []
        steps: list[tuple[str, float, list[int]]] = []
        for k, call in enumerate(s.calls):
            new = [b for b in dict.fromkeys(call.prefix_blocks) if b not in seen]
            seen.update(new)
            if k == 0:
                first = [(call.block_tokens, "fixed_prefix" if len(holders[b]) > 1
                          else "task_input") for b in new]
                continue
            tool, secs = s.tool_before(call.ts)
            if not tool:
                tool, secs = "think", call.ts - s.calls[k - 1].ts
            steps.append((tool, max(secs, 0.0), [call.block_tokens] * len(new)))
        raw.append((s.name, first, steps))
    tokens_total = sum(t for _, first, steps in raw
                       for t in [*(t for t, _ in first), *(t for _, _, ts in steps for t in ts)])
    block = max([t for _, first, _ in raw for t, _ in first] + [1])
    largest = max(sum(t for t, _ in first) + sum(t for _, _, ts in steps for t in ts)
                  for _, first, steps in raw)
    scale = min(1.0, memory_bytes / max(spec.page_bytes(tokens_total), 1),
                max_page_bytes / max(spec.page_bytes(block), 1),
                (max_session_bytes or memory_bytes) / max(spec.page_bytes(largest), 1))
    durations = sorted(d for _, _, steps in raw for _, d, _ in steps) or [1.0]
    t_scale = median_s / max(durations[len(durations) // 2], 1e-6)

    per_page = max(8, max_page_bytes // max(spec.page_bytes(1), 1))  # tokens in one page

    def pack(tokens: list[int]) -> tuple[int, ...]:
        """Scaled blocks of one call, packed into pages of up to one arena page (the
        service charges whole arena pages: many small pages would waste most of it)."""
        pages: list[int] = []
        for t in tokens:
            t = max(8, int(t * scale))
            if pages and pages[-1] + t <= per_page:
                pages[-1] += t
            else:
                pages.append(min(t, per_page))
        return tuple(pages)

    def first_pages(first: list[tuple[int, str]]) -> tuple[tuple[int, str], ...]:
        out: list[tuple[int, str]] = []
        for state in ("fixed_prefix", "task_input"):
            out += [(t, state) for t in pack([t for t, st in first if st == state])]
        return tuple(out) or ((max(8, int(block * scale)), "task_input"),)

    return tuple(TraceEpisode(
        session=name, first=first_pages(first),
        steps=tuple(TraceStep(tool=tool, tool_s=min(cap_s, max(0.01, d * t_scale)),
                              tokens=pack(ts)) for tool, d, ts in steps))
        for name, first, steps in raw)


def summarize(results: Results, traffic: dict[str, int], batches: int) -> dict[str, Any]:
    """The simulator's metric names, from real accesses and real transfer counters."""
    delays = np.array([a.delay_ms for a in results.accesses] or [0.0])
    total = sum(a.nbytes for a in results.accesses) or 1
    hit = sum(a.nbytes for a in results.accesses if a.source == "hbm" and a.delay_ms == 0.0)
    hidden = sum(a.hidden_ms for a in results.accesses)
    visible = float(delays.sum())
    moved = sum(traffic.values())
    return {
        "p50_ms": float(np.percentile(delays, 50)), "p95_ms": float(np.percentile(delays, 95)),
        "p99_ms": float(np.percentile(delays, 99)), "byte_hit_pct": 100.0 * hit / total,
        "transfer_mb_per_batch": moved / 1e6 / max(batches, 1),
        "hidden_pct": 100.0 * hidden / (hidden + visible) if hidden + visible > 0 else 0.0,
        "inexact_pct": 100.0 * sum(a.nbytes for a in results.accesses if not a.exact) / total,
        "verified_pct": 100.0 * sum(a.nbytes for a in results.accesses if a.verified) / total,
        "bytes_per_tier": {k: int(v) for k, v in sorted(traffic.items())},
        "accesses": len(results.accesses), "errors": len(results.errors),
    }

