"""The issue's acceptance lines, checked on the calibrated synthetic workload.

Seeds and batch counts are fixed, so each run computes the same numbers. Every
simulation is computed once per session (``conftest.SimRuns``) and shared: the
3,000-batch headline run also serves as the noise sweep's σ = 0.35 point. The
budget sweep (400 batches per point) and the ablation (1,500) run on fewer
batches: their margins are wide (docs/simulator.md has the 3,000-batch figures,
where the narrowest ablation margin is ×1.24).
"""

from __future__ import annotations

import itertools

import pytest

from agentkv_cluster.sim.policies import POLICY_NAMES
from agentkv_cluster.sim.report import margins_vs_lru
from agentkv_cluster.sim.runner import ABLATIONS, BUDGET_SWEEP, NOISE_SWEEP, Ablation
from tests.slow.sim.conftest import config

pytestmark = pytest.mark.slow

HEADLINE = config(batches=3000)
SWEEP_BATCHES = 400
ABLATION = config(batches=1500)


@pytest.fixture(scope="module")
def headline(sim_runs):
    return {name: sim_runs.metrics(HEADLINE, name) for name in POLICY_NAMES}


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
    assert min(headline, key=lambda n: headline[n].p95_ms) == "agentkv"


def test_agentkv_has_the_lowest_p95_at_every_budget(sim_runs):
    for budget in BUDGET_SWEEP:
        cfg = config(batches=SWEEP_BATCHES, budget=budget)
        p95 = {name: sim_runs.metrics(cfg, name).p95_ms for name in POLICY_NAMES}
        assert all(p95["agentkv"] < v for k, v in p95.items() if k != "agentkv"), (budget, p95)


def test_noise_keeps_agentkv_p95_within_5_percent_while_risk_rises(sim_runs):
    # At 3,000 batches, as documented: only a few % of AgentKV's reads see any delay,
    # so its P95 sits where visible restores begin and needs the full sample to settle.
    points = [sim_runs.metrics(config(batches=3000, noise=n), "agentkv") for n in NOISE_SWEEP]
    p95 = [m.p95_ms for m in points]
    risk = [m.risk_pct for m in points]
    assert max(p95) <= 1.05 * min(p95), p95
    assert all(a < b for a, b in itertools.pairwise(risk)), risk


def test_each_ablation_is_worse_on_the_papers_axis(sim_runs):
    rows = {name: sim_runs.metrics(ABLATION, "agentkv", mech) for name, mech in ABLATIONS.items()}
    norm = Ablation(config=ABLATION, rows=rows).normalized()
    assert norm["no_gap_prefetch"]["p95_ms"] > 1.0
    assert norm["no_reversible_compression"]["transfer_mb_per_batch"] > 1.0
    assert norm["no_event_dependency"]["wrong_eviction_pct"] > 1.0
    assert norm["no_risk_control"]["wrong_eviction_pct"] > 1.0
    assert norm["fixed_precision"]["transfer_mb_per_batch"] > 1.0
