"""``agentkv demo``: the real service on a local Ray, AgentKV vs LRU on one agent workload.

Needs nothing but the installed package: a local Ray, the embedded directory, a host
pool in /dev/shm and an NVMe shard in a temporary folder. Real bytes (fp16 KV pages),
real AES-GCM sealing, real NIXL transfers; tool calls are real sleeps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentkv_cluster.cli import CliError, ProgressLines, check_writable_file
from agentkv_cluster.cli._demo_fits import (
    DEMO_PAGE_BYTES,
    DEMO_POOL_BYTES,
    arena_pages,
    check_fits,
    hbm_capacity,
    this_machine,
    warmup_spec,
)

if TYPE_CHECKING:
    from agentkv_cluster.api.compare import RatioInterval

POLICIES = ("agentkv", "lru")
TRACE_MEMORY_BYTES = 192 << 20  # a replayed trace sample is scaled to fit the 256 MiB pool
TRACE_SESSION_BYTES = 24 << 20  # ... and each session well under half the 96-page arena
TRAIN_SEED_OFFSET = 1000  # the untimed training run's seed: never one the docs report
WARMUP_SESSIONS = 8  # the warm-up's quick round of a synthetic workload: the default's sessions


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run AgentKV vs LRU through the real service")
    p.add_argument("--sessions", type=int, default=8, help="concurrent agent sessions (default 8)")
    p.add_argument("--turns", type=int, default=3, help="tool calls per session (default 3)")
    p.add_argument("--trace", type=Path,
                   help="replay the first --sessions whole sessions of a trace: its blocks as "
                        "pages (tokens scaled to the demo's memory), its tool calls "
                        "(time-scaled)")
    p.add_argument("--trace-format", choices=("agentkv", "mooncake", "azure", "tracelab"),
                   default="agentkv", help="format of --trace (default: agentkv JSON lines)")
    p.add_argument("--json", type=Path, help="write the figures (simulator JSON schema) here")
    p.add_argument("--budget", type=float, default=0.35,
                   help="HBM budget as a fraction of the working set (default 0.35)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs per policy, interleaved AgentKV, LRU, LRU, AgentKV, ... (default 3)")
    p.add_argument("--seed", type=int, default=7,
                   help="seed of the workload (prompts, tool-call lengths; default 7)")
    p.add_argument("--exact", action="store_true",
                   help="the engine takes exact KV only: pages are stored structured, so no "
                        "policy serves a lossy copy (compares tier and timing alone)")
    p.set_defaults(handler=run)


def _spec(args: argparse.Namespace) -> Any:
    from agentkv_cluster.api.workload import WorkloadSpec

    if args.sessions < 1 or args.turns < 1 or args.rounds < 1:
        raise CliError("--sessions, --turns and --rounds must be >= 1")
    if not 0.05 <= args.budget <= 1.0:
        raise CliError("--budget must be in [0.05, 1]")
    if args.seed < 0:
        raise CliError("--seed must be >= 0")
    if args.trace is not None:
        from agentkv_cluster.api.workload import episodes_from_trace
        from agentkv_cluster.sim.trace.format import TraceFormatError

        try:
            episodes = episodes_from_trace(args.trace, args.trace_format, args.sessions,
                                           memory_bytes=TRACE_MEMORY_BYTES,
                                           max_page_bytes=DEMO_PAGE_BYTES,
                                           max_session_bytes=TRACE_SESSION_BYTES)
        except (OSError, TraceFormatError) as exc:
            raise CliError(f"--trace {args.trace}: {exc}") from None
        return WorkloadSpec(sessions=len(episodes), turns=args.turns, seed=args.seed,
                            episodes=episodes, charge_bytes=DEMO_PAGE_BYTES, exact=args.exact)
    return WorkloadSpec(sessions=args.sessions, turns=args.turns, seed=args.seed,
                        charge_bytes=DEMO_PAGE_BYTES, exact=args.exact)


def _config(workdir: Path, capacity: int, sessions: int) -> Any:
    from agentkv_cluster.config import load_config

    return load_config(overrides={
        # one connection per session, and room for the warm-up's next ones as they close
        "api": {"port": 0, "max_connections": max(256, 2 * sessions)},
        "metrics": {"enabled": False},
        "hbm": {"page_bytes": DEMO_PAGE_BYTES, "num_pages": arena_pages(capacity)},
        "pool": {"pool_bytes": DEMO_POOL_BYTES, "slot_bytes": 1 << 20,
                 "nvme_dir": str(workdir / "nvme")},
        "ray": {"num_cpus": 2}, "security": {"tenant_keys_dir": str(workdir / "keys")},
    })


def _table(figures: dict[str, dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="AgentKV vs LRU through the real service")
    cols = [("p50_ms", "P50 ms"), ("p95_ms", "P95 ms"), ("p99_ms", "P99 ms"),
            ("byte_hit_pct", "byte hit %"), ("transfer_mb_per_batch", "MB/session"),
            ("hidden_pct", "hidden %"), ("verified_pct", "verified %"),
            ("inexact_pct", "inexact %")]
    table.add_column("policy")
    for _, label in cols:
        table.add_column(label, justify="right")
    table.add_column("bytes per tier (MB)")
    for name, f in figures.items():
        tiers = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in f["bytes_per_tier"].items())
        table.add_row(name, *[f"{f[k]:.2f}" for k, _ in cols], tiers)
    return table


def _print_table(console: Any, figures: dict[str, dict[str, Any]]) -> None:
    """Print the table whole: the console grows to the table's natural width (120 to 140
    columns, the more tiers a row lists the wider), so no header is cut to "MB/sessi…"
    and no row's bytes per tier wraps over several lines, in a log or a narrow terminal."""
    from rich.measure import Measurement

    table = _table(figures)
    needed = Measurement.get(console, console.options.update_width(1000), table).maximum
    console.width = max(console.width, needed)
    console.print(table)


def _ratio_line(r: RatioInterval) -> str:
    """The P95 ratio with its interval, and what the interval says."""
    from agentkv_cluster.api.compare import Reading

    reading = r.reading()
    verdict = (f"this run {reading.value} at P95" if reading is Reading.UNCLEAR
               else f"AgentKV {reading.value} at P95")
    return (f"P95 ratio AgentKV/LRU {r.ratio:.2f} ({100 * r.level:.0f} % bootstrap "
            f"interval over sessions {r.low:.2f}-{r.high:.2f}): {verdict}; the sessions "
            f"of one run share the machine, so seeds give a wider, truer interval "
            f"(benchmarks/bench_demo_seeds.py)")


def _warm_up(service: Any, spec: Any) -> None:
    """Untimed, before any measured run:

    - one short round (the first ``WARMUP_SESSIONS`` sessions, or for a trace as many as
      its HBM budget holds resuming at once; one quick tool call, AgentKV so both lossy
      codecs run): the first transfers between two processes set up NIXL connections and
      the first codec calls load kernels. Without it whichever policy runs first pays for
      that;
    - for a synthetic workload, one AgentKV run of the same kind of workload on another
      seed (``TRAIN_SEED_OFFSET`` higher): a running service has seen such agents
      before, and AgentKV's predictor learns online from what it sees (tool durations,
      reuse, its own calibration; ``Service.use_policy`` keeps that, and nothing else,
      across the measured runs). Without it every measured AgentKV run would start cold
      and spend its first resumes in the conservative LRU fallback. LRU has nothing to
      learn. A replayed trace gets no such run (another part of the trace would be
      measured data): its first AgentKV round starts cold.
    """
    from dataclasses import replace

    from agentkv_cluster.api.workload import run_workload

    quick = warmup_spec(spec)
    if spec.episodes:  # a replayed trace's budget (a few pages, maybe) knows nothing of
        # these synthetic sessions: at most as many as it holds resuming at once (a resume
        # pins its session's pages), or their stores wait for room until refused
        fits = max(1, service.hbm_capacity // quick.largest_session())
        quick = replace(quick, sessions=min(quick.sessions, fits))
    else:  # a few sessions set up the connections and kernels; hundreds at once, unstaggered,
        # pinned more than the budget holds and waited for room until refused (600 did)
        quick = replace(quick, sessions=min(quick.sessions, WARMUP_SESSIONS))
    runs = [("warmup", quick)]
    if not spec.episodes:
        runs.append(("train", replace(spec, seed=spec.seed + TRAIN_SEED_OFFSET)))
    for run, workload in runs:
        service.use_policy("agentkv")
        results = run_workload(lambda: service.client("demo"), workload, run)
        if results.errors:
            raise CliError(f"{run}: {len(results.errors)} session(s) failed: "
                           f"{results.errors[0]}")


def round_order(rounds: int) -> list[str]:
    """AgentKV, LRU, LRU, AgentKV, ...: drift on a shared machine hits both policies alike."""
    order: list[str] = []
    for r in range(rounds):
        order += list(POLICIES if r % 2 == 0 else reversed(POLICIES))
    return order


def by_session(accesses: list[Any], run: str, sessions: int) -> list[list[float]]:
    """The delays (ms) of each session ``0..sessions-1`` of ``run``, in session order: the
    units ``pooled_ratio`` resamples, paired across policies (session j of a policy's
    round r replays the same episode as session j of the other's round r)."""
    out: list[list[float]] = [[] for _ in range(sessions)]
    for a in accesses:
        name, _, index = a.session.rpartition("-s")
        if name == run and index.isdigit() and int(index) < sessions:
            out[int(index)].append(a.delay_ms)
    return out


def run_demo(spec: Any, budget: float, progress: Any | None = None,
             rounds: int = 3) -> dict[str, Any]:
    """Both policies, same workload, one service, ``rounds`` runs each (pooled); returns
    the JSON payload."""
    from agentkv_cluster.api.compare import pooled_ratio
    from agentkv_cluster.api.workload import Results, run_workload, summarize
    from agentkv_cluster.runtime.service import Service

    # The demo always starts its own Ray: never join one another process left running.
    os.environ["RAY_ADDRESS"] = "local"
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-demo-"))
    spec, capacity = hbm_capacity(spec, budget)
    working_set = spec.working_set()
    service = Service(_config(workdir, capacity, spec.sessions), workdir=workdir,
                      policy=POLICIES[0],
                      hbm_capacity=capacity)
    pooled = {p: Results() for p in POLICIES}
    units: dict[str, list[list[float]]] = {p: [] for p in POLICIES}  # per (round, session)
    traffic: dict[str, Counter[str]] = {p: Counter() for p in POLICIES}
    tasks = {p: progress.add_task(f"{p:8s}", total=spec.resumes() * rounds)
             for p in POLICIES} if progress else {}
    try:
        service.start()
        _warm_up(service, spec)
        for i, policy in enumerate(round_order(rounds)):
            service.use_policy(policy)  # fresh controller, emptied actors: same start for each
            task = tasks.get(policy)
            tick = (lambda t=task: progress.advance(t)) if progress else (lambda: None)
            results = run_workload(lambda: service.client("demo"), spec, f"{policy}{i}", tick)
            if results.errors:
                raise CliError(f"{policy}: {len(results.errors)} session(s) failed: "
                               f"{results.errors[0]}")
            pooled[policy].accesses += results.accesses
            units[policy] += by_session(results.accesses, f"{policy}{i}", spec.sessions)
            traffic[policy].update(service.stats()["traffic"])
    finally:
        service.stop(shutdown_ray=True)
        shutil.rmtree(workdir, ignore_errors=True)
    figures = {p: summarize(pooled[p], dict(traffic[p]), spec.sessions * rounds)
               for p in POLICIES}
    ratio = pooled_ratio(units["agentkv"], units["lru"]) if pressed(figures) else None
    return {"policies": figures, "p95_ratio": ratio and asdict(ratio), "config": {
        "sessions": spec.sessions, "turns": spec.turns, "seed": spec.seed, "rounds": rounds,
        "order": round_order(rounds), "hbm_budget": budget, "hbm_capacity_bytes": capacity,
        "working_set_bytes": working_set, "exact": spec.exact}}


def pressed(figures: dict[str, dict[str, Any]]) -> bool:
    """Whether some page was read again and some read, under either policy, was not served
    straight from HBM: otherwise the two runs had nothing to differ in (no read, or no
    memory pressure at this budget) and a ratio of their delays says nothing."""
    return any(f["accesses"] and f["byte_hit_pct"] < 100.0 for f in figures.values())


class _LineProgress:
    """The two calls ``run_demo`` makes on a rich Progress, as periodic plain lines."""

    def __init__(self) -> None:
        self.bars: dict[int, ProgressLines] = {}

    def add_task(self, description: str, total: int) -> int:
        self.bars[len(self.bars)] = ProgressLines(f"demo {description.strip()} resumes", total)
        return len(self.bars) - 1

    def advance(self, task: int) -> None:
        self.bars[task].advance()


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from agentkv_cluster.api.compare import RatioInterval

    spec = _spec(args)
    check_writable_file(args.json, "--json")
    check_fits(*hbm_capacity(spec, args.budget), this_machine(), args.budget)
    console = Console(width=max(110, Console().width))  # _print_table widens it for the table
    t0 = time.monotonic()
    if console.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} resumes"), TimeElapsedColumn(),
                      console=console) as progress:
            payload = run_demo(spec, args.budget, progress, args.rounds)
    else:  # CI logs and pods: a plain line every 10 s instead of a bar nobody sees
        payload = run_demo(spec, args.budget, _LineProgress(), args.rounds)
    _print_table(console, payload["policies"])
    a, b = payload["policies"]["agentkv"], payload["policies"]["lru"]
    console.print(f"P95 restore delay: AgentKV {a['p95_ms']:.1f} ms vs LRU {b['p95_ms']:.1f} ms; "
                  f"bytes moved: {a['transfer_mb_per_batch']:.2f} vs "
                  f"{b['transfer_mb_per_batch']:.2f} MB per session "
                  f"({time.monotonic() - t0:.0f} s)")
    if payload["p95_ratio"] is not None:
        console.print(_ratio_line(RatioInterval(**payload["p95_ratio"])), soft_wrap=True)
    else:
        reads = a["accesses"] + b["accesses"]
        console.print("This run compares nothing: " + (
            "no page of this workload is read again (p95_ratio is null in --json)"
            if not reads else
            "every read was served from HBM under both policies (no memory pressure: the "
            "HBM budget, at least two whole sessions, holds what these sessions keep live; "
            "p95_ratio is null in --json)"), soft_wrap=True)
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return 0
