"""Simulator throughput: 3,000 batches x every policy of the default report, timed.

The default ``agentkv simulate`` runs the five policies plus the four baselines
given end-of-life signals (``fair:*``). Prints the wall time of the whole
comparison (target <= 60 s on the reference machine), the time per policy run,
each run's CPU time as a ratio to LRU's (the figure that survives a noisy
machine), and the 1-minute load average.

    .venv/bin/python benchmarks/bench_simulator.py [--batches 3000] [--workload paper]
"""

from __future__ import annotations

import argparse
import os
import time

from agentkv_cluster.sim.config import PRESETS, SimConfig, WorkloadConfig
from agentkv_cluster.sim.policies import BASELINES, POLICY_NAMES
from agentkv_cluster.sim.runner import deliver, make_workload, run_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--workload", choices=PRESETS, default="paper")
    args = parser.parse_args()
    cfg = SimConfig(workload=WorkloadConfig(batches=args.batches, preset=args.workload))
    t0 = time.perf_counter()
    workload = deliver(make_workload(cfg), cfg)
    generate = time.perf_counter() - t0
    runs = [(n, False) for n in POLICY_NAMES] + [(n, True) for n in BASELINES]
    wall, cpu = {}, {}
    for name, fair in runs:
        label = f"fair:{name}" if fair else name
        w, c = time.perf_counter(), time.process_time()
        run_policy(workload, cfg, name, fair=fair)
        wall[label], cpu[label] = time.perf_counter() - w, time.process_time() - c
    total = time.perf_counter() - t0
    print(f"workload={args.workload} batches={args.batches} runs={len(runs)} "
          f"load(1 min)={os.getloadavg()[0]:.2f} cpus={os.cpu_count()}")
    print(f"workload generation: {generate:.2f} s")
    print(f"{'run':<15}{'wall s':>9}{'cpu s':>9}{'x LRU':>8}")
    for label, secs in wall.items():
        print(f"{label:<15}{secs:>9.2f}{cpu[label]:>9.2f}{cpu[label] / cpu['lru']:>8.2f}")
    print(f"total wall: {total:.2f} s (target <= 60 s); total cpu: {sum(cpu.values()):.2f} s")


if __name__ == "__main__":
    main()
