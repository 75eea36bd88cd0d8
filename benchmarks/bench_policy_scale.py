"""Victim selection as the resident set grows: the full sort per call vs the kept order.

Part 1 drives each policy the way the simulator does for one model call of N blocks:
every block arrives at one ``now``, and once the fast tier (35 % of the blocks) is
full each arrival first asks ``select_victims`` for room. Each policy runs twice in
one process on the same pages: as shipped (its order kept between calls) and as a
reference subclass that builds the whole order per call, as every policy did before
(the reference code is kept below). Both must pick the same victims; the table shows
the time ratio (reference / kept, best of ``--repeat`` runs each), never absolute
times as a claim. A second column does the same with a fresh ``now`` per call (no
two calls share a sort). LRU is the same code on both sides: its ratio shows the
measurement's noise.

Part 2 replays a synthetic one-call trace of ``--single`` blocks (default 200,000)
through the simulator with AgentKV and prints how long it took to finish.

    python benchmarks/bench_policy_scale.py [--sizes 2000,5000,10000] [--single 200000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the frozen reference orders

from agentkv_cluster.policy.agentkv import AgentKvPolicy
from agentkv_cluster.policy.base import PageView, StateType
from agentkv_cluster.policy.baselines import (
    ArcPolicy,
    LruPolicy,
    SemanticPolicy,
    TrackedPolicy,
    TtlPolicy,
)
from tests.unit.policy.reference_orders import agentkv_conservative, agentkv_order

MB = 1 << 20
TYPES = list(StateType)


# ---------------------------------------------------------------- the reference orders
class FullSortAgentKv(AgentKvPolicy):
    """The fallback test summed and the order sorted afresh on every call (the frozen
    reference the kept-order tests compare against)."""

    def conservative(self) -> bool:
        return agentkv_conservative(self, self._pages)

    def _victim_walk(self, now: float) -> list[int]:
        return agentkv_order(self, self._pages, now)


class FullSortTtl(TtlPolicy):
    def _victim_walk(self, now: float):  # the columnar sort over every row, per call
        return self._victim_order(now)


class FullSortSemantic(SemanticPolicy):
    def _victim_walk(self, now: float):
        return self._victim_order(now)


class FullListArc(ArcPolicy):
    def _victim_order(self, now: float) -> Iterator[int]:
        t1 = [pid for pid in self._t1.items if not self._pages[pid].pinned]
        t2 = [pid for pid in self._t2.items if not self._pages[pid].pinned]
        t1_bytes = self._t1.bytes
        i = j = 0
        while i < len(t1) or j < len(t2):
            if i < len(t1) and (t1_bytes > self.p or j >= len(t2)):
                t1_bytes -= self._t1.items[t1[i]]
                i += 1
                yield t1[i - 1]
            else:
                j += 1
                yield t2[j - 1]


PAIRS: dict[str, tuple[Callable[[int], TrackedPolicy], Callable[[int], TrackedPolicy]]] = {
    "agentkv": (lambda cap: AgentKvPolicy(), lambda cap: FullSortAgentKv()),
    "agentkv-conservative": (lambda cap: AgentKvPolicy(), lambda cap: FullSortAgentKv()),
    "ttl": (lambda cap: TtlPolicy(), lambda cap: FullSortTtl()),
    "semantic": (lambda cap: SemanticPolicy(), lambda cap: FullSortSemantic()),
    "arc": (lambda cap: ArcPolicy(cap), lambda cap: FullListArc(cap)),
    "lru": (lambda cap: LruPolicy(), lambda cap: LruPolicy()),
}


# ---------------------------------------------------------------- part 1
def blocks(n: int, seed: int, confidence: float) -> list[PageView]:
    rng = np.random.default_rng(seed)
    return [PageView(page_id=i, size_bytes=MB, state_type=TYPES[int(rng.integers(len(TYPES)))],
                     predicted_idle_s=float(rng.exponential(5.0)),
                     reuse_prob=float(rng.uniform()), recompute_cost_s=float(rng.uniform(0, 2)),
                     correctness_weight=float(rng.uniform()), confidence=confidence,
                     importance=float(rng.uniform(0, 0.3)))
            for i in range(n)]


def one_call(policy: TrackedPolicy, views: list[PageView], fresh_now: bool
             ) -> tuple[float, list[list[int]]]:
    """Seconds to bring every block in (select_victims + on_insert), and the victims."""
    capacity = int(0.35 * len(views)) * MB
    chosen: list[list[int]] = []
    start = time.perf_counter()
    for i, v in enumerate(views):
        now = 1.0 + (i * 1e-4 if fresh_now else 0.0)
        v.last_access = now
        over = policy.resident_bytes() + v.size_bytes - capacity
        if over > 0:
            chosen.append(policy.select_victims(over, now))
        policy.on_insert(v, now)
    return time.perf_counter() - start, chosen


def compare(name: str, n: int, fresh_now: bool, seed: int, repeat: int) -> float:
    """Best of ``repeat`` alternating runs of each side: full sort time / kept time."""
    kept_factory, full_factory = PAIRS[name]
    confidence = 0.2 if name == "agentkv-conservative" else 0.9
    cap = int(0.35 * n) * MB
    best_kept = best_full = float("inf")
    for _ in range(repeat):
        t_kept, v_kept = one_call(kept_factory(cap), blocks(n, seed, confidence), fresh_now)
        t_full, v_full = one_call(full_factory(cap), blocks(n, seed, confidence), fresh_now)
        if v_kept != v_full:
            raise SystemExit(f"{name} n={n}: the kept order chose other victims than the "
                             "full sort")
        best_kept, best_full = min(best_kept, t_kept), min(best_full, t_full)
    return best_full / best_kept


# ---------------------------------------------------------------- part 2
def single_call(n: int) -> float:
    """Seconds for the simulator to replay one model call of ``n`` blocks (AgentKV)."""
    from agentkv_cluster.sim.config import SimConfig
    from agentkv_cluster.sim.runner import run_policy
    from agentkv_cluster.sim.trace.format import TraceEvent
    from agentkv_cluster.sim.trace.replay import replay_workload

    events = [TraceEvent(session="s", ts=0.0, kind="model_call", tokens=n * 16,
                         block_tokens=16, prefix_blocks=tuple(range(n))),
              TraceEvent(session="s", ts=1.0, kind="task_end")]
    cfg = SimConfig()
    start = time.perf_counter()
    workload = replay_workload(events, cfg, "one call")
    done = 0
    last = start

    def progress(pages: int) -> None:
        nonlocal done, last
        done += pages
        if time.perf_counter() - last > 5.0 or done == n:
            last = time.perf_counter()
            print(f"  ... {done:,}/{n:,} blocks replayed ({last - start:.0f} s)", flush=True)

    run_policy(workload, cfg, "agentkv", progress=progress)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2000,5000,10000",
                    help="blocks per model call, comma separated (default 2000,5000,10000)")
    ap.add_argument("--policies", default=",".join(PAIRS), help="subset of " + ",".join(PAIRS))
    ap.add_argument("--single", type=int, default=200_000,
                    help="blocks of the one-call simulator replay (0 skips it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per side, best kept (3)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [p for p in args.policies.split(",") if p]
    for p in names:
        if p not in PAIRS:
            ap.error(f"unknown policy {p!r}; known: {', '.join(PAIRS)}")
    print("select_victims + on_insert over one model call; ratio = full sort / kept order "
          "(same victims checked)")
    print(f"{'policy':<22}{'blocks':>8}{'one now':>10}{'fresh now':>11}")
    for name in names:
        for n in sizes:
            print(f"  running {name} at {n:,} blocks ...", end="\r", file=sys.stderr, flush=True)
            same = compare(name, n, False, args.seed, args.repeat)
            fresh = compare(name, n, True, args.seed, args.repeat)
            if sys.stderr.isatty():  # clear the progress line; a log keeps it, one per row
                print(" " * 60, end="\r", file=sys.stderr, flush=True)
            else:
                print(file=sys.stderr, flush=True)
            print(f"{name:<22}{n:>8,}{same:>9.1f}x{fresh:>10.1f}x", flush=True)
    if args.single:
        print(f"simulator, AgentKV, one model call of {args.single:,} blocks:")
        print(f"finished in {single_call(args.single):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
