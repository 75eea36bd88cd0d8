"""Runs workloads against policies: one comparison, budget/noise sweeps, Table-5 ablations.

Pure: progress is reported through an optional callback so the CLI can draw a
rich bar without the simulator importing any UI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.engine import BatchRun, BatchTrace
from agentkv_cluster.sim.metrics import PolicyMetrics, summarize
from agentkv_cluster.sim.policies import POLICY_NAMES, driver_factory
from agentkv_cluster.sim.workload import Workload, synthetic_workload

Progress = Callable[[int], None]  # called with the number of batches just finished

BUDGET_SWEEP: tuple[float, ...] = (0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60,
                                   0.65, 0.70)
NOISE_SWEEP: tuple[float, ...] = (0.05, 0.10, 0.20, 0.35, 0.50, 0.70, 0.90)

# Table 5 rows: name -> the one mechanism switched off.
ABLATIONS: Mapping[str, Mechanisms] = {
    "full": Mechanisms(),
    "no_gap_prefetch": Mechanisms(gap_prefetch=False),
    "no_reversible_compression": Mechanisms(reversible_compression=False),
    "no_event_dependency": Mechanisms(event_dependency=False),
    "no_risk_control": Mechanisms(risk_control=False),
    "fixed_precision": Mechanisms(adaptive_precision=False),
}
ABLATION_AXES: tuple[str, ...] = ("p95_ms", "transfer_mb_per_batch", "wrong_eviction_pct")


class UnknownPolicy(ValueError):
    """A policy name the simulator does not know."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """All policies on one workload under one config."""

    config: SimConfig
    source: str
    batches: int
    policies: Mapping[str, PolicyMetrics]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "workload": {"source": self.source, "batches": self.batches},
            "policies": {name: m.to_dict() for name, m in self.policies.items()},
        }


def run_policy(workload: Workload, cfg: SimConfig, name: str, *,
               mechanisms: Mechanisms | None = None,
               progress: Progress | None = None) -> PolicyMetrics:
    """One policy over every batch of ``workload``."""
    trace = BatchTrace()
    factory = driver_factory(name, cfg, mechanisms=mechanisms)
    for batch in workload:
        BatchRun(batch, factory(batch), trace=trace).run()
        if progress is not None:
            progress(1)
    return summarize(trace, len(workload))


def compare(cfg: SimConfig, *, workload: Workload | None = None,
            policies: Sequence[str] = POLICY_NAMES,
            progress: Progress | None = None) -> Comparison:
    """Every policy in ``policies`` on ``workload`` (default: the synthetic one of ``cfg``)."""
    for name in policies:
        if name not in POLICY_NAMES:
            raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    wl = workload if workload is not None else synthetic_workload(cfg)
    results = {name: run_policy(wl, cfg, name, progress=progress) for name in policies}
    return Comparison(config=cfg, source=wl.source, batches=len(wl), policies=results)


def sweep(cfg: SimConfig, axis: str, values: Sequence[float], *,
          policies: Sequence[str] = POLICY_NAMES,
          progress: Progress | None = None) -> list[Comparison]:
    """``compare`` at each value of ``axis`` ("budget" or "noise"); same seed throughout."""
    if axis not in ("budget", "noise"):
        raise ValueError(f"sweep axis must be 'budget' or 'noise', got {axis!r}")
    return [compare(cfg.replace(**{axis: v}), policies=policies, progress=progress)
            for v in values]


@dataclass(frozen=True, kw_only=True)
class Ablation:
    config: SimConfig
    rows: Mapping[str, PolicyMetrics]

    def normalized(self) -> dict[str, dict[str, float | None]]:
        """Each row's P95, transfer and wrong-eviction proxy relative to full AgentKV."""
        full = self.rows["full"]
        out = {}
        for name, m in self.rows.items():
            out[name] = {axis: _ratio(getattr(m, axis), getattr(full, axis))
                         for axis in ABLATION_AXES}
        return out

    def to_dict(self) -> dict[str, Any]:
        norm = self.normalized()
        return {
            "config": self.config.to_dict(),
            "ablation": {name: {"metrics": m.to_dict(), "normalized": norm[name]}
                         for name, m in self.rows.items()},
        }


def ablation(cfg: SimConfig, *, workload: Workload | None = None,
             progress: Progress | None = None) -> Ablation:
    """AgentKV with each Table-5 mechanism switched off in turn."""
    wl = workload if workload is not None else synthetic_workload(cfg)
    rows = {name: run_policy(wl, cfg, "agentkv", mechanisms=mech, progress=progress)
            for name, mech in ABLATIONS.items()}
    return Ablation(config=cfg, rows=rows)


def _ratio(value: float, base: float) -> float | None:
    """value / base; None where the base is 0 (JSON has no infinity)."""
    if base == 0.0:
        return 1.0 if value == 0.0 else None
    return round(value / base, 6)
