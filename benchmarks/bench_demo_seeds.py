"""The demo's AgentKV vs LRU comparison over many seeds, like for like, quiet or loaded.

One real service (local Ray, host pool, NVMe shard, NIXL); per seed the same synthetic
agent workload runs once per policy on a fresh controller (the order alternates with the
seed, so drift hits both alike). Every resume calls ``prepare_load`` and ``complete_load``:
a lossy working copy is verified against its FULL reference there, and that fetch counts in
the policy's delay and bytes; pages served lossy (no reference kept) are reported as
``inexact %``. ``--hog`` runs a busy loop on one core next to the service for the whole run
(``--hogs N``: N of them, an overloaded box). Besides the per-seed counts it prints the
median per-seed P95 ratio and the P95 of every access of every seed per policy (one seed's
P95 rests on its ~10 slowest accesses, often one resume), with the pooled ratio's 90 %
bootstrap interval (``pooled_ratio``: whole seeds resampled), and where the slowest 5 % of
each policy's loads spent their time (``LoadPhases``: pages being moved out, blocked for
room, own transfers, arrivals). Figures reported in the docs use seeds 1-10 (settings were
tuned on seeds >= 100 only).

    python benchmarks/bench_demo_seeds.py --seeds 1-10 [--hog | --hogs N] [--json OUT] [--png OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_ADDRESS"] = "local"

KEYS = ("p50_ms", "p95_ms", "p99_ms", "transfer_mb_per_batch", "hidden_pct", "verified_pct",
        "inexact_pct")


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def _hog(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    while not stop.is_set():
        for _ in range(100_000):
            pass


def run(seeds: list[int], sessions: int, turns: int, budget: float, exact: bool = False) -> dict:
    from agentkv_cluster.api.workload import WorkloadSpec, run_workload, summarize
    from agentkv_cluster.cli._demo_fits import hbm_capacity
    from agentkv_cluster.cli.demo import POLICIES, _config, _warm_up
    from agentkv_cluster.runtime.service import Service

    sized = {s: hbm_capacity(WorkloadSpec(sessions=sessions, turns=turns, seed=s, exact=exact),
                             budget)
             for s in seeds}
    specs = {s: spec for s, (spec, _) in sized.items()}
    capacity = max(cap for _, cap in sized.values())
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-seeds-"))
    service = Service(_config(workdir, capacity, sessions), workdir=workdir, policy=POLICIES[0],
                      hbm_capacity=capacity)
    rows: dict[int, dict[str, dict]] = {}
    delays: dict[str, list[list[float]]] = {p: [] for p in POLICIES}  # per seed, every access
    loads: dict[str, list] = {p: [] for p in POLICIES}  # every load's LoadPhases
    gave_room = dict.fromkeys(POLICIES, 0)  # prefetches that gave way to a blocked load
    try:
        service.start()
        _warm_up(service, specs[seeds[0]])
        for i, seed in enumerate(seeds):
            order = POLICIES if i % 2 == 0 else tuple(reversed(POLICIES))
            rows[seed] = {}
            for policy in order:
                service.use_policy(policy)
                res = run_workload(lambda: service.client("demo"), specs[seed], f"{policy}{seed}")
                if res.errors:
                    raise SystemExit(f"seed {seed} {policy}: {res.errors[0]}")
                stats = service.stats()
                rows[seed][policy] = summarize(res, stats["traffic"], sessions)
                loads[policy] += stats["load_phases"]
                gave_room[policy] += stats["prefetches_gave_room"]
                delays[policy].append([a.delay_ms for a in res.accesses])
            a, b = rows[seed]["agentkv"], rows[seed]["lru"]
            print(f"seed {seed:3d}: P95 AgentKV {a['p95_ms']:7.1f} ms vs LRU {b['p95_ms']:7.1f}"
                  f" | MB/session {a['transfer_mb_per_batch']:6.2f} vs "
                  f"{b['transfer_mb_per_batch']:6.2f} | inexact {a['inexact_pct']:4.1f} %",
                  flush=True)
    finally:
        service.stop(shutdown_ray=True)
        shutil.rmtree(workdir, ignore_errors=True)
    every = {p: [x for seed in d for x in seed] or [0.0] for p, d in delays.items()}
    pooled = {p: {f"p{q}_ms": float(np.percentile(d, q)) for q in (50, 95, 99)}
              for p, d in every.items()}
    return {"seeds": {s: {p: {k: r[p][k] for k in KEYS} for p in r} for s, r in rows.items()},
            "pooled": pooled, "delays_ms": delays,
            "slowest_loads": {p: slowest(ls) for p, ls in loads.items()},
            "blocked_loads": {p: sum(x.blocked_s > 0 for x in ls) for p, ls in loads.items()},
            "prefetches_gave_room": gave_room,
            "config": {"sessions": sessions, "turns": turns, "budget": budget,
                       "hbm_capacity_bytes": capacity}}


def slowest(loads: list, share: float = 0.05) -> dict:
    """Mean seconds per phase of the slowest ``share`` of ``loads`` (``LoadPhases``)."""
    if not loads:
        return {}
    worst = sorted(loads, key=lambda p: p.total_s)[-max(1, round(share * len(loads))):]
    means = np.mean([p.seconds() for p in worst], axis=0)
    return {"loads": len(worst), "of": len(loads),
            **{f"{name}_ms": 1e3 * float(v) for name, v in zip(worst[0].PHASES, means)}}


def verdict(payload: dict) -> dict:
    from agentkv_cluster.api.compare import pooled_ratio

    seeds = payload["seeds"]
    p95_wins = sum(r["agentkv"]["p95_ms"] < r["lru"]["p95_ms"] for r in seeds.values())
    fewer_bytes = sum(r["agentkv"]["transfer_mb_per_batch"] < r["lru"]["transfer_mb_per_batch"]
                      for r in seeds.values())
    ratio = statistics.median(r["agentkv"]["p95_ms"] / max(r["lru"]["p95_ms"], 1e-9)
                              for r in seeds.values())
    pooled = payload["pooled"]
    by_seed = payload["delays_ms"]
    interval = pooled_ratio(by_seed["agentkv"], by_seed["lru"])
    return {"seeds": len(seeds), "p95_wins": p95_wins, "fewer_bytes": fewer_bytes,
            "median_p95_ratio": ratio, "pooled_p95_ms": {p: pooled[p]["p95_ms"] for p in pooled},
            "pooled_p95_ratio": {**asdict(interval), "reading": interval.reading().name}}


def plot(payload: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(payload["seeds"], key=int)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, label in ((axes[0], "p95_ms", "P95 restore delay (ms)"),
                           (axes[1], "transfer_mb_per_batch", "MB moved per session")):
        for policy in ("agentkv", "lru"):
            ax.plot(seeds, [payload["seeds"][s][policy][key] for s in seeds], marker="o",
                    label=policy)
        ax.set_xlabel("seed")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.35)
    ap.add_argument("--hog", action="store_true", help="a busy loop on one core meanwhile")
    ap.add_argument("--hogs", type=int, default=None, metavar="N",
                    help="N busy loops meanwhile (an overloaded box; --hog is --hogs 1)")
    ap.add_argument("--exact", action="store_true",
                    help="pages stored structured: no policy serves a lossy copy")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    hogs = args.hogs if args.hogs is not None else int(args.hog)
    if hogs < 0:
        ap.error(f"--hogs must be >= 0, not {hogs}")
    stop = multiprocessing.Event()
    loops = [multiprocessing.Process(target=_hog, args=(stop,), daemon=True)
             for _ in range(hogs)]
    for loop in loops:
        loop.start()
    t0 = time.monotonic()
    try:
        payload = run(_seeds(args.seeds), args.sessions, args.turns, args.budget, args.exact)
    finally:
        stop.set()
        for loop in loops:
            loop.join(5)
    payload["verdict"] = verdict(payload)
    payload["config"]["hog"] = hogs > 0
    payload["config"]["hogs"] = hogs
    payload["config"]["exact"] = args.exact
    payload["config"]["load_avg"] = os.getloadavg()
    payload["config"]["seconds"] = time.monotonic() - t0
    v = payload["verdict"]
    print(f"AgentKV P95 below LRU on {v['p95_wins']}/{v['seeds']} seeds; fewer bytes on "
          f"{v['fewer_bytes']}/{v['seeds']} (load avg {os.getloadavg()[0]:.1f})")
    pooled = v["pooled_p95_ms"]
    print(f"median AgentKV/LRU P95 ratio over seeds {v['median_p95_ratio']:.2f}; P95 of every "
          f"access of every seed: AgentKV {pooled['agentkv']:.1f} ms vs LRU {pooled['lru']:.1f}")
    ci = v["pooled_p95_ratio"]
    print(f"pooled P95 ratio AgentKV/LRU {ci['ratio']:.2f}, {100 * ci['level']:.0f} % bootstrap "
          f"interval over seeds {ci['low']:.2f}-{ci['high']:.2f}"
          + (" (holds 1: these runs cannot tell the two apart at P95)"
             if ci["reading"] == "UNCLEAR" else ""))
    for policy, row in payload["slowest_loads"].items():
        if row:
            print(f"slowest {row['loads']} of {row['of']} loads, {policy}: mean total "
                  f"{row['total_ms']:.0f} ms = settle {row['settle_ms']:.0f} + blocked "
                  f"{row['blocked_ms']:.0f} + transfer {row['transfer_ms']:.0f} + arrival "
                  f"{row['arrival_ms']:.0f} ms (the rest: resolving, reporting)")
    print("loads blocked for room: " + ", ".join(
        f"{p} {n}" for p, n in payload["blocked_loads"].items()) + "; prefetches that gave "
        "their room to one: " + ", ".join(
        f"{p} {n}" for p, n in payload["prefetches_gave_room"].items()))
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if args.png:
        plot(payload, args.png, "AgentKV vs LRU, real service, per seed"
             + (f" ({hogs} CPU hog{'s' if hogs > 1 else ''})" if hogs else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
