"""One simulation per (workload, policy, mechanisms) per test session.

The acceptance checks overlap: the headline run is also the noise sweep's
σ = 0.35 point and the ablation's "full" row. ``SimRuns`` computes each run at
most once and every test reads the shared result.
"""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.sim.config import SignalQuality, SimConfig, WorkloadConfig
from agentkv_cluster.sim.metrics import PolicyMetrics
from agentkv_cluster.sim.policies import BASELINES
from agentkv_cluster.sim.runner import deliver, run_policy
from agentkv_cluster.sim.workload import Workload, synthetic_workload


def config(*, batches: int, budget: float = 0.35, noise: float = 0.35, miss: float = 0.0,
           seed: int = 0) -> SimConfig:
    return SimConfig(seed=seed, budget=budget, noise=noise, signals=SignalQuality(miss=miss),
                     workload=WorkloadConfig(batches=batches))


class SimRuns:
    def __init__(self) -> None:
        self._workloads: dict[tuple, Workload] = {}
        self._metrics: dict[tuple, PolicyMetrics] = {}

    @staticmethod
    def _key(cfg: SimConfig) -> tuple:
        return (cfg.seed, cfg.budget, cfg.noise, cfg.workload.batches, cfg.signals)

    def metrics(self, cfg: SimConfig, policy: str,
                mechanisms: Mechanisms | None = None, *, fair: bool = False) -> PolicyMetrics:
        """``fair``: the baseline acting on the end-of-life signals (AgentKV always does)."""
        mech = mechanisms if policy == "agentkv" else None
        if policy == "agentkv" and mech is None:
            mech = Mechanisms()
        fair = fair and policy != "agentkv"
        key = (*self._key(cfg), policy, mech, fair)
        if key not in self._metrics:
            wl = self._workloads.get(self._key(cfg))
            if wl is None:
                wl = self._workloads[self._key(cfg)] = deliver(synthetic_workload(cfg), cfg)
            self._metrics[key] = run_policy(wl, cfg, policy, mechanisms=mech, fair=fair)
        return self._metrics[key]

    def strongest(self, cfg: SimConfig, metric: str) -> float:
        """The best baseline value of ``metric`` over the paper-faithful and fair runs."""
        return min(getattr(self.metrics(cfg, name, fair=fair), metric)
                   for name in BASELINES for fair in (False, True))


@pytest.fixture(scope="session")
def sim_runs() -> SimRuns:
    return SimRuns()
