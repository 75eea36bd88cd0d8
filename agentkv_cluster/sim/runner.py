"""Runs workloads against policies: one comparison, budget/noise sweeps, Table-5 ablations.

Pure: progress is reported through an optional callback so the CLI can draw a
rich bar without the simulator importing any UI.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.policy.base import ALL_SIGNALS, Mechanisms
from agentkv_cluster.sim.config import SignalQuality, SimConfig
from agentkv_cluster.sim.engine import BatchRun, BatchTrace
from agentkv_cluster.sim.metrics import PolicyMetrics, summarize
from agentkv_cluster.sim.policies import BASELINES, POLICY_NAMES, driver_factory
from agentkv_cluster.sim.signals import degrade_workload
from agentkv_cluster.sim.workload import Workload, synthetic_workload

# Called with the number of pages just replayed (within a batch too: a trace is one
# batch); a run's total is ``pages(workload)`` per policy run.
Progress = Callable[[int], None]

BUDGET_SWEEP: tuple[float, ...] = (0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60,
                                   0.65, 0.70)
NOISE_SWEEP: tuple[float, ...] = (0.05, 0.10, 0.20, 0.35, 0.50, 0.70, 0.90)
SIGNAL_SWEEP: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)  # P(signal lost)
SWEEP_AXES: tuple[str, ...] = ("budget", "noise", "signal")

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


class DuplicatePolicy(ValueError):
    """A policy named twice in one comparison (its results are keyed by name)."""


def check_policy_names(policies: Sequence[str]) -> None:
    """Raise ``UnknownPolicy`` for a name not in ``POLICY_NAMES`` and ``DuplicatePolicy``
    for a name given twice: a second run would only overwrite the first one's row."""
    for name in policies:
        if name not in POLICY_NAMES:
            raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    twice = sorted({n for n in policies if list(policies).count(n) > 1})
    if twice:
        raise DuplicatePolicy(f"policy {', '.join(twice)} given more than once; "
                              f"name each policy once")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """All policies on one workload under one config. ``policies``: the paper-faithful
    baselines (no end-of-life signals) and AgentKV; ``fair_policies`` (when run): the
    same keys, every baseline acting on the same delivered signals as AgentKV."""

    config: SimConfig
    source: str
    batches: int
    policies: Mapping[str, PolicyMetrics]
    fair_policies: Mapping[str, PolicyMetrics] | None = None

    def strongest(self, metric: str) -> tuple[str, float] | None:
        """The best baseline on ``metric`` (lower is better) over both sets:
        ("lru" | "fair:lru" ..., value); None without a baseline."""
        cands = [(n, getattr(m, metric)) for n, m in self.policies.items() if n != "agentkv"]
        cands += [(f"fair:{n}", getattr(m, metric))
                  for n, m in (self.fair_policies or {}).items() if n != "agentkv"]
        return min(cands, key=lambda c: (c[1], c[0])) if cands else None

    def margins(self) -> dict[str, Any] | None:
        """AgentKV against the strongest baseline, per metric (negative = lower); None
        without AgentKV, or when no page was read again (every delay is 0 by construction:
        there is nothing to compare)."""
        if "agentkv" not in self.policies or self.policies["agentkv"].reads == 0:
            return None
        a = self.policies["agentkv"]
        out: dict[str, Any] = {}
        for metric in ("p95_ms", "p99_ms", "transfer_mb_per_batch"):
            best = self.strongest(metric)
            if best is None:
                return None
            name, value = best
            mine = getattr(a, metric)
            out[metric] = {"strongest": name, "baseline": round(value, 6),
                           "agentkv": round(mine, 6),
                           "change_pct": round((mine - value) / value * 100, 4) if value
                           else (0.0 if mine == 0 else None)}
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.config.to_dict(),
            "workload": {"source": self.source, "batches": self.batches},
            "policies": {name: m.to_dict() for name, m in self.policies.items()},
        }
        if self.fair_policies is not None:
            out["fair_policies"] = {n: m.to_dict() for n, m in self.fair_policies.items()}
            out["agentkv_vs_strongest"] = self.margins()
        return out


def run_policy(workload: Workload, cfg: SimConfig, name: str, *,
               mechanisms: Mechanisms | None = None, fair: bool = False,
               progress: Progress | None = None) -> PolicyMetrics:
    """One policy over every batch of ``workload`` (signals as already delivered)."""
    trace = compact_trace()
    factory = driver_factory(name, cfg, mechanisms=mechanisms,
                             signals=ALL_SIGNALS if fair else ())
    for batch in workload:
        BatchRun(batch, factory(batch), trace=trace).run(progress)
    return summarize(trace, len(workload))


def compact_trace() -> BatchTrace:
    """An empty ``BatchTrace`` whose per-read columns are typed arrays: 8 bytes (1 for
    a hit) a read instead of a list slot and a Python number (32), for the same values
    (``summarize`` reads them as numpy arrays either way)."""
    return BatchTrace(access_bytes=array("q"), access_hit=array("b"),
                      access_visible_ms=array("d"), access_restore_ms=array("d"),
                      access_risk=array("d"), access_weight=array("d"),
                      access_wrong=array("d"))


def pages(workload: Workload) -> int:
    """The pages of every batch of ``workload``: the unit of ``Progress``."""
    return sum(batch.n_pages for batch in workload)


def make_workload(cfg: SimConfig) -> Workload:
    """The synthetic workload of ``cfg``'s preset (paper or agent-loop)."""
    if cfg.workload.preset == "agent-loop":
        from agentkv_cluster.sim.agent_loop import agent_loop_workload

        return agent_loop_workload(cfg)
    return synthetic_workload(cfg)


def deliver(workload: Workload, cfg: SimConfig) -> Workload:
    """``workload`` with its end-of-life signals as ``cfg.signals`` delivers them."""
    return degrade_workload(workload, cfg.signals, cfg.seed)


def runs_per_comparison(policies: Sequence[str], fair: bool) -> int:
    return len(policies) + (sum(p in BASELINES for p in policies) if fair else 0)


def compare(cfg: SimConfig, *, workload: Workload | None = None,
            policies: Sequence[str] = POLICY_NAMES, fair: bool = False,
            progress: Progress | None = None) -> Comparison:
    """Every policy in ``policies`` on ``workload`` (default: the synthetic one of ``cfg``);
    with ``fair`` each baseline also runs acting on the signals (``fair_policies``)."""
    check_policy_names(policies)
    wl = deliver(workload if workload is not None else make_workload(cfg), cfg)
    results = {name: run_policy(wl, cfg, name, progress=progress) for name in policies}
    fair_results = None
    if fair:
        fair_results = {name: (results[name] if name not in BASELINES else
                               run_policy(wl, cfg, name, fair=True, progress=progress))
                        for name in policies}
    return Comparison(config=cfg, source=wl.source, batches=len(wl), policies=results,
                      fair_policies=fair_results)


def sweep(cfg: SimConfig, axis: str, values: Sequence[float], *,
          policies: Sequence[str] = POLICY_NAMES, fair: bool = False,
          build: Callable[[SimConfig], Workload] = make_workload,
          progress: Progress | None = None) -> list[Comparison]:
    """``compare`` at each value of ``axis`` ("budget", "noise" or "signal": the
    probability that a signal is lost); same seed throughout. ``build`` makes the
    workload of each point (the synthetic preset, or a trace replayed at that point's
    budget and noise)."""
    if axis not in SWEEP_AXES:
        raise ValueError(f"sweep axis must be one of {', '.join(SWEEP_AXES)}, got {axis!r}")
    out = []
    for v in values:
        if axis == "signal":
            point = cfg.replace(signals=SignalQuality(
                miss=v, delay_s=cfg.signals.delay_s, false_rate=cfg.signals.false_rate))
        else:
            point = cfg.replace(**{axis: v})
        out.append(compare(point, workload=build(point), policies=policies, fair=fair,
                           progress=progress))
    return out



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
    wl = deliver(workload if workload is not None else make_workload(cfg), cfg)
    rows = {name: run_policy(wl, cfg, "agentkv", mechanisms=mech, progress=progress)
            for name, mech in ABLATIONS.items()}
    return Ablation(config=cfg, rows=rows)


def _ratio(value: float, base: float) -> float | None:
    """value / base; None where the base is 0 (JSON has no infinity)."""
    if base == 0.0:
        return 1.0 if value == 0.0 else None
    return round(value / base, 6)
