"""Placement planner scaling: full plan at 1k..1M pages, and one incremental replan.

Usage: python benchmarks/bench_planner.py [--sizes 1000,10000,100000,1000000] [--seed 0]

Times are CPU seconds of this process (``time.process_time``; the planner is
single-threaded), so other jobs on a shared machine do not inflate them; wall
seconds are printed alongside.

Targets (checked on ratios measured in this one run):
- growth exponent of full-plan time over the sizes (least-squares slope of
  log time vs log n) <= 1.25, i.e. close to n log n;
- incremental replan after one tool-start event (one session's 32 pages
  touched) at 100k pages <= 2% of the full plan at 100k.
Exits 1 when a target fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agentkv_cluster.policy.base import PageView, StateType
from agentkv_cluster.policy.placement import PlacementPlanner
from agentkv_cluster.policy.value import ValueModel
from store.types import Tier

PAGES_PER_SESSION = 32  # one batch of the paper's workload (Table 3)
EXPONENT_TARGET = 1.25
REPLAN_TARGET = 0.02
REPLAN_AT = 100_000


def make_pages(n: int, rng: np.random.Generator) -> list[PageView]:
    types = list(StateType)
    size = np.clip(rng.lognormal(np.log(48e6), 0.8, n), 8e6, 220e6).astype(np.int64)
    kind = rng.integers(0, len(types), n)
    reuse, recompute = rng.random(n), rng.exponential(0.5, n)
    weight, idle, dep = rng.random(n), rng.lognormal(0.5, 1.0, n), rng.integers(0, 4, n)
    return [
        PageView(page_id=i, size_bytes=int(size[i]), state_type=types[kind[i]],
                 session=f"s{i // PAGES_PER_SESSION}", position=(i % PAGES_PER_SESSION) * 512,
                 tokens=512, reuse_prob=float(reuse[i]), recompute_cost_s=float(recompute[i]),
                 correctness_weight=float(weight[i]), predicted_idle_s=float(idle[i]),
                 dependency=float(dep[i]))
        for i in range(n)
    ]


def capacities(pages: list[PageView]) -> dict[Tier, int]:
    total = sum(p.size_bytes for p in pages)
    return {Tier.HBM: int(total * 0.35), Tier.HOST: int(total * 0.25),
            Tier.NVME: int(total * 0.5)}


def time_full(pages, caps, repeats: int) -> tuple[float, float, PlacementPlanner]:
    """(best CPU s, wall s of that run, planner) over ``repeats`` full plans."""
    best, wall, planner = float("inf"), 0.0, None
    for _ in range(repeats):
        planner = PlacementPlanner(ValueModel())
        c0, w0 = time.process_time(), time.perf_counter()
        plan = planner.plan(pages, caps, now=0.0)
        cpu = time.process_time() - c0
        if cpu < best:
            best, wall = cpu, time.perf_counter() - w0
        for tier in Tier:  # the bench doubles as a large-scale capacity check
            assert plan.used_bytes[tier] <= caps[tier], (tier, plan.used_bytes, caps)
    return best, wall, planner


def time_tool_start(planner: PlacementPlanner, pages: list[PageView],
                    rng: np.random.Generator, events: int) -> float:
    """Median replan CPU time after a tool start: the session's pages get longer idle times."""
    sessions = len(pages) // PAGES_PER_SESSION
    samples = []
    for s in rng.choice(sessions, size=events, replace=False):
        touched = range(s * PAGES_PER_SESSION, (s + 1) * PAGES_PER_SESSION)
        for i in touched:
            pages[i].predicted_idle_s *= 8.0  # the tool call makes the whole session idle
            pages[i].reuse_prob *= 0.9
        t0 = time.process_time()
        planner.replan(touched, now=1.0)
        samples.append(time.process_time() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    console = Console()
    full: dict[int, float] = {}
    wall: dict[int, float] = {}
    replan_s = None
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("planning", total=len(sizes))
        for n in sizes:
            progress.update(task, description=f"{n:,} pages: building")
            pages = make_pages(n, rng)
            caps = capacities(pages)
            progress.update(task, description=f"{n:,} pages: full plan")
            full[n], wall[n], planner = time_full(pages, caps, repeats=3 if n <= 100_000 else 1)
            if n == REPLAN_AT:
                progress.update(task, description=f"{n:,} pages: replans")
                replan_s = time_tool_start(planner, pages, rng, events=25)
            del pages, planner
            progress.advance(task)
    return report(console, full, wall, replan_s)


def report(console: Console, full: dict[int, float], wall: dict[int, float],
           replan_s: float | None) -> int:
    table = Table(title="placement planner: full plan")
    table.add_column("pages", justify="right")
    table.add_column("full plan CPU s", justify="right")
    table.add_column("CPU us / page", justify="right")
    table.add_column("wall s", justify="right")
    for n, t in full.items():
        table.add_row(f"{n:,}", f"{t:.4f}", f"{t / n * 1e6:.2f}", f"{wall[n]:.4f}")
    console.print(table)
    ok = True
    if len(full) >= 2:
        slope = float(np.polyfit(np.log(list(full)), np.log(list(full.values())), 1)[0])
        passed = slope <= EXPONENT_TARGET
        ok &= passed
        console.print(f"growth exponent (log-log slope over {len(full)} sizes): {slope:.3f} "
                      f"target <= {EXPONENT_TARGET}: {'PASS' if passed else 'FAIL'}")
    if replan_s is not None:
        ratio = replan_s / full[REPLAN_AT]
        passed = ratio <= REPLAN_TARGET
        ok &= passed
        console.print(f"incremental replan after one tool start at {REPLAN_AT:,} pages "
                      f"({PAGES_PER_SESSION} pages touched): {replan_s * 1e3:.3f} ms = "
                      f"{ratio * 100:.3f}% of the full plan; target <= {REPLAN_TARGET:.0%}: "
                      f"{'PASS' if passed else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
