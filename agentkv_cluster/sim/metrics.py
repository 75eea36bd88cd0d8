"""From recorded facts to the paper's metrics (Table 4 columns plus the ablation proxies).

- restore delay P50/P95/P99: visible delay of every read of a reused page,
  0 for a hit or a fully hidden prefetch (ms);
- byte hit rate: bytes read while still resident since their last use / bytes read;
- transfer MB per batch: lower tier -> HBM bytes (restores and prefetches) at the
  stored precision, as the paper counts it (its Table 4 transfer column equals
  (1 - byte hit) x reused bytes / compression ratio for every row);
- hidden fraction: mean over reads that needed a restore (one that takes time) of the
  share of the restore's duration that finished before the read;
- risk proxy (§3.2): mean over reads of |log prediction error| x correctness
  weight x demotion depth;
- high-value wrong-eviction proxy: over reads of high-value pages (correctness
  weight >= 0.5), the correctness weight of those that had been evicted, scaled
  up by the demotion depth when no full reference copy was kept;
- false-signal cost: reads of pages a policy freed on a premature end-of-life
  signal, and the recompute milliseconds they paid (also in the delay columns).

Correctness weights here are the workload's true ones, not the policy's priors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from agentkv_cluster.policy.risk import RiskController
from agentkv_cluster.sim.config import MB
from store.types import Codec

if TYPE_CHECKING:
    from agentkv_cluster.sim.drivers import Demotion
    from agentkv_cluster.sim.engine import BatchTrace

HIGH_VALUE_WEIGHT = 0.5


def wrong_eviction_weight(weight: float, demotion: Demotion) -> float:
    """Weight one read of an evicted page (true correctness ``weight``) adds to the
    wrong-eviction proxy."""
    if weight < HIGH_VALUE_WEIGHT:
        return 0.0
    reversible = demotion.reference or demotion.codec is Codec.FULL
    depth = 0.0 if reversible else RiskController.demotion_depth(demotion.tier, demotion.codec)
    return weight * (1.0 + depth)


def risk_of_read(weight: float, demotion: Demotion, predicted_idle_s: float,
                 actual_idle_s: float) -> float:
    """§3.2 risk proxy of one restore: |log prediction error| x weight x depth."""
    error = abs(math.log(max(actual_idle_s, 1e-9) / max(predicted_idle_s, 1e-9)))
    return error * weight * RiskController.demotion_depth(demotion.tier, demotion.codec)


@dataclass(frozen=True, kw_only=True)
class PolicyMetrics:
    p50_ms: float
    p95_ms: float
    p99_ms: float
    byte_hit_pct: float
    transfer_mb_per_batch: float
    hidden_pct: float
    risk_pct: float
    wrong_eviction_pct: float
    demoted_mb_per_batch: float
    wasted_prefetch_mb_per_batch: float
    reads: int
    overflow_events: int
    retired_pages_per_batch: float = 0.0
    false_signal_reads: int = 0
    false_signal_ms_per_batch: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(trace: BatchTrace, batches: int) -> PolicyMetrics:
    """Aggregate one policy's trace over ``batches`` batches."""
    size = np.asarray(trace.access_bytes, dtype=np.float64)
    hit = np.asarray(trace.access_hit, dtype=bool)
    visible = np.asarray(trace.access_visible_ms, dtype=np.float64)
    total = np.asarray(trace.access_restore_ms, dtype=np.float64)
    risk = np.asarray(trace.access_risk, dtype=np.float64)
    weight = np.asarray(trace.access_weight, dtype=np.float64)
    wrong = np.asarray(trace.access_wrong, dtype=np.float64)
    n = int(size.size)
    if n:
        p50, p95, p99 = (float(x) for x in np.percentile(visible, [50, 95, 99]))
    else:
        p50 = p95 = p99 = 0.0
    restored = ~hit & (total > 0)  # a restore that took no time had nothing to hide (0/0)
    if restored.any():
        hidden = np.clip((total[restored] - visible[restored]) / total[restored], 0.0, 1.0)
        hidden_pct = float(hidden.mean() * 100)
    else:
        hidden_pct = 0.0
    high = weight >= HIGH_VALUE_WEIGHT
    high_weight = float(weight[high].sum())
    return PolicyMetrics(
        p50_ms=p50, p95_ms=p95, p99_ms=p99,
        byte_hit_pct=float(size[hit].sum() / size.sum() * 100) if n else 0.0,
        transfer_mb_per_batch=trace.transfer_bytes / MB / batches,
        hidden_pct=hidden_pct,
        risk_pct=float(risk.mean() * 100) if n else 0.0,
        wrong_eviction_pct=float(wrong.sum() / high_weight * 100) if high_weight else 0.0,
        demoted_mb_per_batch=trace.demoted_bytes / MB / batches,
        wasted_prefetch_mb_per_batch=trace.wasted_prefetch_bytes / MB / batches,
        reads=n,
        overflow_events=trace.overflow_events,
        retired_pages_per_batch=trace.retired_pages / batches,
        false_signal_reads=trace.false_signal_reads,
        false_signal_ms_per_batch=trace.false_signal_ms / batches,
    )
