"""The acceptance lines, checked on the calibrated synthetic workload.

Seeds and batch counts are fixed, so each run computes the same numbers. Every
simulation is computed once per session (``conftest.SimRuns``) and shared: the
3,000-batch headline run also serves as the noise sweep's σ = 0.35 point. The
budget x signal-loss grid (400 batches per point), the noise sweep (1,000) and
the ablation (1,500) run on fewer batches: their margins are wide
(docs/simulator.md has the figures). "Strongest baseline" is, per metric, the
best of LRU, TTL, semantic and ARC, each both paper-faithful and acting on the
same end-of-life signals as AgentKV.
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
NOISE_BATCHES = 1000
ABLATION = config(batches=1500)
GRID_BUDGETS = (0.20, 0.35, 0.50, 0.70)
GRID_MISS = (0.0, 0.25, 0.5)


@pytest.fixture(scope="module")
def headline(sim_runs):
    return {name: sim_runs.metrics(HEADLINE, name) for name in POLICY_NAMES}


def test_lru_row_is_within_15_percent_of_the_paper(headline):
    lru = headline["lru"]
    assert lru.p95_ms == pytest.approx(5.59, rel=0.15)
    assert lru.transfer_mb_per_batch == pytest.approx(563.10, rel=0.15)


def test_agentkv_beats_paper_faithful_lru_by_at_least_the_papers_margins(headline):
    m = margins_vs_lru(headline)
    assert m["p95_change_pct"] <= -32.5
    assert m["p99_change_pct"] <= -37.0
    assert m["transfer_change_pct"] <= -71.7
    assert m["hidden_pct"] >= 50.0
    assert min(headline, key=lambda n: headline[n].p95_ms) == "agentkv"


def test_agentkv_beats_the_strongest_baseline_at_the_headline(sim_runs, headline):
    for metric in ("p95_ms", "p99_ms", "transfer_mb_per_batch"):
        assert getattr(headline["agentkv"], metric) < sim_runs.strongest(HEADLINE, metric)


@pytest.mark.parametrize("budget", GRID_BUDGETS)
@pytest.mark.parametrize("miss", GRID_MISS)
def test_agentkv_p95_is_at_or_below_the_strongest_baseline_at_each_budget_and_signal_loss(
        sim_runs, budget, miss):
    cfg = config(batches=SWEEP_BATCHES, budget=budget, miss=miss)
    mine, best = sim_runs.metrics(cfg, "agentkv").p95_ms, sim_runs.strongest(cfg, "p95_ms")
    assert mine <= best and (mine < best or best == 0.0), (budget, miss, mine, best)


@pytest.mark.parametrize("budget", [b for b in GRID_BUDGETS if b <= 0.5])
@pytest.mark.parametrize("miss", GRID_MISS)
def test_agentkv_moves_fewer_bytes_than_the_strongest_baseline_up_to_budget_half(
        sim_runs, budget, miss):
    # At budget 0.7 it does not everywhere (docs/simulator.md, 1,000 batches: 0.36 vs 0.17
    # MB/batch with every signal, 4.64 vs 4.33 at 25 % lost; below at 50 % lost, 18.9 vs 21.6).
    cfg = config(batches=SWEEP_BATCHES, budget=budget, miss=miss)
    mine = sim_runs.metrics(cfg, "agentkv").transfer_mb_per_batch
    assert mine < sim_runs.strongest(cfg, "transfer_mb_per_batch"), (budget, miss)


def test_agentkv_p95_is_lowest_at_every_budget_of_the_sweep(sim_runs):
    for budget in BUDGET_SWEEP:
        cfg = config(batches=SWEEP_BATCHES, budget=budget)
        mine, best = sim_runs.metrics(cfg, "agentkv").p95_ms, sim_runs.strongest(cfg, "p95_ms")
        assert mine <= best and (mine < best or best == 0.0), (budget, mine, best)


def test_fresh_noise_per_level_raises_risk_and_keeps_agentkv_p95_within_15_percent(sim_runs):
    # Each level draws its own errors (the workload module doc); the pages are common.
    points = [sim_runs.metrics(config(batches=NOISE_BATCHES, noise=n), "agentkv")
              for n in NOISE_SWEEP]
    p95 = [m.p95_ms for m in points]
    risk = [m.risk_pct for m in points]
    assert max(p95) <= 1.15 * min(p95), p95
    assert all(a < b for a, b in itertools.pairwise(risk)), risk


def test_each_ablation_is_worse_on_the_papers_axis(sim_runs):
    rows = {name: sim_runs.metrics(ABLATION, "agentkv", mech) for name, mech in ABLATIONS.items()}
    norm = Ablation(config=ABLATION, rows=rows).normalized()
    assert norm["no_gap_prefetch"]["p95_ms"] > 1.0
    assert norm["no_reversible_compression"]["transfer_mb_per_batch"] > 1.0
    assert norm["no_event_dependency"]["wrong_eviction_pct"] > 1.0
    assert norm["no_risk_control"]["wrong_eviction_pct"] > 1.0
    assert norm["fixed_precision"]["transfer_mb_per_batch"] > 1.0
