"""The issue's acceptance lines, checked on the calibrated synthetic workload.

Seeds and batch counts are fixed, so each run computes the same numbers; the
smaller batch counts of the sweeps keep the suite within its time budget (the
3000-batch figures are in docs/simulator.md).
"""

from __future__ import annotations

import itertools

import pytest

from agentkv_cluster.sim.config import SimConfig, WorkloadConfig
from agentkv_cluster.sim.report import margins_vs_lru
from agentkv_cluster.sim.runner import BUDGET_SWEEP, NOISE_SWEEP, ablation, compare, sweep

pytestmark = pytest.mark.slow


def cfg(batches: int) -> SimConfig:
    return SimConfig(seed=0, budget=0.35, noise=0.35, workload=WorkloadConfig(batches=batches))


@pytest.fixture(scope="module")
def headline():
    return compare(cfg(3000)).policies


def test_lru_row_is_within_15_percent_of_the_paper(headline):
    lru = headline["lru"]
    assert lru.p95_ms == pytest.approx(5.59, rel=0.15)
    assert lru.transfer_mb_per_batch == pytest.approx(563.10, rel=0.15)


def test_agentkv_beats_lru_by_at_least_the_papers_margins(headline):
    m = margins_vs_lru(headline)
    assert m["p95_change_pct"] <= -32.5
    assert m["p99_change_pct"] <= -37.0
    assert m["transfer_change_pct"] <= -71.7
    assert m["hidden_pct"] >= 50.0


def test_agentkv_has_the_lowest_p95_at_every_budget():
    for value, res in zip(BUDGET_SWEEP, sweep(cfg(600), "budget", BUDGET_SWEEP)):
        p95 = {name: m.p95_ms for name, m in res.policies.items()}
        assert min(p95, key=p95.get) == "agentkv", (value, p95)
        assert all(p95["agentkv"] < v for k, v in p95.items() if k != "agentkv"), (value, p95)


def test_noise_keeps_agentkv_p95_within_5_percent_while_risk_rises():
    # At 3,000 batches, as documented: about 5 % of AgentKV's reads see any delay, so
    # its P95 sits where visible restores begin and needs the full sample to settle.
    points = sweep(cfg(3000), "noise", NOISE_SWEEP, policies=("agentkv",))
    p95 = [r.policies["agentkv"].p95_ms for r in points]
    risk = [r.policies["agentkv"].risk_pct for r in points]
    assert max(p95) <= 1.05 * min(p95), p95
    assert all(a < b for a, b in itertools.pairwise(risk)), risk


def test_each_ablation_is_worse_on_the_papers_axis():
    norm = ablation(cfg(1500)).normalized()
    assert norm["no_gap_prefetch"]["p95_ms"] > 1.0
    assert norm["no_reversible_compression"]["transfer_mb_per_batch"] > 1.0
    assert norm["no_event_dependency"]["wrong_eviction_pct"] > 1.0
    assert norm["no_risk_control"]["wrong_eviction_pct"] > 1.0
    assert norm["fixed_precision"]["transfer_mb_per_batch"] > 1.0
