"""Tables (as plain rows) and deterministic JSON for simulator results.

The CLI renders the rows with rich; tests and docs use them directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentkv_cluster.sim.metrics import PolicyMetrics

# (metric attribute, column header)
TABLE4_COLUMNS: tuple[tuple[str, str], ...] = (
    ("p50_ms", "P50 ms"), ("p95_ms", "P95 ms"), ("p99_ms", "P99 ms"),
    ("byte_hit_pct", "byte hit %"), ("transfer_mb_per_batch", "MB/batch"),
    ("hidden_pct", "hidden %"), ("risk_pct", "risk %"),
    ("wrong_eviction_pct", "wrong-evict %"),
)

# Paper Table 4 (budget 0.35, noise 0.35), for side-by-side printing only.
PAPER_TABLE4: Mapping[str, Mapping[str, float]] = {
    "lru": {"p50_ms": 2.66, "p95_ms": 5.59, "p99_ms": 7.45, "byte_hit_pct": 34.70,
            "transfer_mb_per_batch": 563.10, "hidden_pct": 0.00},
    "ttl": {"p50_ms": 2.61, "p95_ms": 5.75, "p99_ms": 7.78, "byte_hit_pct": 33.71,
            "transfer_mb_per_batch": 571.69, "hidden_pct": 0.00},
    "semantic": {"p50_ms": 0.00, "p95_ms": 5.83, "p99_ms": 7.84, "byte_hit_pct": 42.99,
                 "transfer_mb_per_batch": 491.68, "hidden_pct": 0.00},
    "agentkv": {"p50_ms": 0.00, "p95_ms": 3.77, "p99_ms": 4.68, "byte_hit_pct": 40.82,
                "transfer_mb_per_batch": 159.49, "hidden_pct": 50.28},
}

# Paper Table 5, normalised to full AgentKV: (P95, transfer, wrong-eviction proxy).
PAPER_TABLE5: Mapping[str, tuple[float, float, float]] = {
    "full": (1.00, 1.00, 1.00),
    "no_gap_prefetch": (1.41, 1.00, 1.00),
    "no_reversible_compression": (1.27, 3.20, 0.92),
    "no_event_dependency": (1.18, 1.09, 1.64),
    "no_risk_control": (0.94, 0.91, 2.73),
    "fixed_precision": (1.12, 1.36, 1.08),
}


def metric_rows(policies: Mapping[str, PolicyMetrics]) -> list[list[str]]:
    """One row per policy: name then TABLE4_COLUMNS, two decimals."""
    return [[name, *(f"{getattr(m, attr):.2f}" for attr, _ in TABLE4_COLUMNS)]
            for name, m in policies.items()]


def margins_vs_lru(policies: Mapping[str, PolicyMetrics]) -> dict[str, float | None]:
    """AgentKV relative to LRU in percent (negative = lower), as the paper states them;
    None where LRU's value is 0 and AgentKV's is not (no finite relative change)."""
    a, b = policies["agentkv"], policies["lru"]

    def change(x: float, y: float) -> float | None:
        if y:
            return (x - y) / y * 100
        return 0.0 if x == 0 else None

    return {
        "p95_change_pct": change(a.p95_ms, b.p95_ms),
        "p99_change_pct": change(a.p99_ms, b.p99_ms),
        "transfer_change_pct": change(a.transfer_mb_per_batch, b.transfer_mb_per_batch),
        "hidden_pct": a.hidden_pct,
    }


def sweep_rows(axis: str, points: Sequence[tuple[float, Mapping[str, PolicyMetrics]]],
               metric: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of ``metric`` per policy at each sweep point."""
    names = list(points[0][1]) if points else []
    header = [axis, *names]
    rows = [[f"{value:.2f}", *(f"{getattr(res[n], metric):.2f}" for n in names)]
            for value, res in points]
    return header, rows


def sweep_to_dict(config: Mapping[str, Any], axis: str,
                  points: Sequence[tuple[float, Mapping[str, PolicyMetrics]]]) -> dict[str, Any]:
    return {
        "config": dict(config),
        "sweep": {"axis": axis, "points": [
            {"value": value, "policies": {n: m.to_dict() for n, m in res.items()}}
            for value, res in points]},
    }


def dumps(payload: Mapping[str, Any]) -> str:
    """Deterministic JSON: sorted keys, fixed float formatting (the same seed gives
    the same bytes)."""
    return json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json(payload: Mapping[str, Any], path: Path) -> None:
    Path(path).write_text(dumps(payload), encoding="utf-8")
