"""Simulator throughput: 3,000 batches x 5 policies, timed side by side.

Prints the wall time of the whole comparison (the issue's target is <= 60 s on
the reference machine), the time per policy, and each policy's time as a ratio
to LRU's (the figure that survives a noisy machine).

    .venv/bin/python benchmarks/bench_simulator.py [--batches 3000]
"""

from __future__ import annotations

import argparse
import time

from agentkv_cluster.sim.config import SimConfig, WorkloadConfig
from agentkv_cluster.sim.policies import POLICY_NAMES
from agentkv_cluster.sim.runner import run_policy
from agentkv_cluster.sim.workload import synthetic_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args()
    cfg = SimConfig(workload=WorkloadConfig(batches=args.batches))
    t0 = time.perf_counter()
    workload = synthetic_workload(cfg)
    generate = time.perf_counter() - t0
    wall, cpu = {}, {}
    for name in POLICY_NAMES:
        w, c = time.perf_counter(), time.process_time()
        run_policy(workload, cfg, name)
        wall[name], cpu[name] = time.perf_counter() - w, time.process_time() - c
    total = time.perf_counter() - t0
    print(f"batches={args.batches} policies={len(POLICY_NAMES)}")
    print(f"workload generation: {generate:.2f} s")
    print(f"{'policy':<10}{'wall s':>9}{'cpu s':>9}{'x LRU':>8}")
    for name in POLICY_NAMES:
        print(f"{name:<10}{wall[name]:>9.2f}{cpu[name]:>9.2f}{cpu[name] / cpu['lru']:>8.2f}")
    print(f"total wall: {total:.2f} s (target <= 60 s); total cpu: {sum(cpu.values()):.2f} s")


if __name__ == "__main__":
    main()
