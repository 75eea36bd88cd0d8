"""One simulation per (workload, policy, mechanisms) per test session.

The acceptance checks overlap: the headline run is also the noise sweep's
σ = 0.35 point and the ablation's "full" row. ``SimRuns`` computes each run at
most once and every test reads the shared result.
"""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.sim.config import SimConfig, WorkloadConfig
from agentkv_cluster.sim.metrics import PolicyMetrics
from agentkv_cluster.sim.runner import run_policy
from agentkv_cluster.sim.workload import Workload, synthetic_workload


def config(*, batches: int, budget: float = 0.35, noise: float = 0.35) -> SimConfig:
    return SimConfig(seed=0, budget=budget, noise=noise, workload=WorkloadConfig(batches=batches))


class SimRuns:
    def __init__(self) -> None:
        self._workloads: dict[tuple, Workload] = {}
        self._metrics: dict[tuple, PolicyMetrics] = {}

    @staticmethod
    def _key(cfg: SimConfig) -> tuple:
        return (cfg.seed, cfg.budget, cfg.noise, cfg.workload.batches)

    def metrics(self, cfg: SimConfig, policy: str,
                mechanisms: Mechanisms | None = None) -> PolicyMetrics:
        mech = mechanisms if policy == "agentkv" else None
        if policy == "agentkv" and mech is None:
            mech = Mechanisms()
        key = (*self._key(cfg), policy, mech)
        if key not in self._metrics:
            wl = self._workloads.get(self._key(cfg))
            if wl is None:
                wl = self._workloads[self._key(cfg)] = synthetic_workload(cfg)
            self._metrics[key] = run_policy(wl, cfg, policy, mechanisms=mech)
        return self._metrics[key]


@pytest.fixture(scope="session")
def sim_runs() -> SimRuns:
    return SimRuns()
