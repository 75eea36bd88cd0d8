"""A synthetic agent workload replayed through the wire client (the demo and the benchmarks).

Each session is one agent episode: task start (fixed prefix + task input), then
``turns`` rounds of model call (evidence + draft pages) -> tool call (a real sleep,
log-normal per tool class) -> observation -> resume, where the engine loads every
live page and the service reports, per page, where it came from and how long the
engine waited. Sessions run concurrently, one client connection each.
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

    def page_bytes(self, tokens: int) -> int:
        return 2 * self.layers * self.kv_heads * tokens * self.head_dim * 2


@dataclass(slots=True)
class Access:
    session: str
    source: str
    delay_ms: float
    hidden_ms: float
    nbytes: int


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

    def page(self, state_type: str) -> dict[str, Any]:
        s = self.spec
        tokens = self.rng.choice(s.tokens)
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
                "shape": [s.layers, s.kv_heads, tokens, s.head_dim]}

    def ev(self, **fields: Any) -> dict[str, Any]:
        self.version += 1
        return {"event_id": self.version, "task_id": "task", "version": self.version,
                "ts": time.time(), **fields}


def _store(sc: SessionClient, ep: _Episode, pages: list[dict[str, Any]]) -> None:
    keys = sc.store_pages(pages)
    for page, key in zip(pages, keys):
        ep.live[page["page_id"]] = key


def _resume(sc: SessionClient, ep: _Episode, results: Results) -> None:
    pids = sorted(ep.live)
    keys = [ep.live[p] for p in pids]
    prep = sc.prepare_load(keys)
    with results.lock:
        for pid, page in zip(pids, prep["pages"]):
            results.accesses.append(Access(session=ep.session, source=page["source"],
                                           delay_ms=page["delay_ms"],
                                           hidden_ms=page["hidden_ms"], nbytes=ep.sizes[pid]))
    sc.release(keys)


def run_episode(client: AgentKvClient, spec: WorkloadSpec, index: int, run: str,
                results: Results, tick: Callable[[], None]) -> None:
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

    def one(i: int) -> None:
        try:
            with connect() as client:
                run_episode(client, spec, i, run, results, tick)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            with results.lock:
                results.errors.append(f"session {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(spec.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def tool_plan_from_trace(path: Any, sessions: int, median_s: float = 0.5, cap_s: float = 2.0
                         ) -> tuple[tuple[tuple[str, float], ...], ...]:
    """Tool calls per session from a trace in the simulator's format, time-scaled so the
    median tool call lasts ``median_s`` (the demo replays minutes of agent time in seconds)."""
    from agentkv_cluster.sim.trace.format import TraceFormatError, read_trace

    parsed = read_trace(path)
    by_session: dict[str, list[tuple[str, float]]] = {}
    for e in parsed.events:
        if e.kind == "tool_start":
            by_session.setdefault(e.session, []).append((e.tool_class or "tool",
                                                          e.tool_duration_s))
    plans = [calls for calls in by_session.values() if calls][:sessions]
    if not plans:
        raise TraceFormatError(f"{path}: no tool_start events to replay")
    durations = sorted(d for calls in plans for _, d in calls)
    scale = median_s / max(durations[len(durations) // 2], 1e-6)
    return tuple(tuple((tool, min(cap_s, max(0.01, d * scale))) for tool, d in calls)
                 for calls in plans)


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
        "bytes_per_tier": {k: int(v) for k, v in sorted(traffic.items())},
        "accesses": len(results.accesses), "errors": len(results.errors),
    }
