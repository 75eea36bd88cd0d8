"""End-of-life signals in the simulator: fair baselines, signal quality, no oracle inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType as S
from agentkv_cluster.policy.base import ALL_SIGNALS
from agentkv_cluster.sim.config import (
    DEFAULT_TYPES,
    MB,
    SignalQuality,
    SignalQualityError,
    SimConfig,
    WorkloadConfig,
)
from agentkv_cluster.sim.engine import BatchRun
from agentkv_cluster.sim.policies import BASELINES, POLICY_NAMES, driver_factory
from agentkv_cluster.sim.runner import compare, deliver
from agentkv_cluster.sim.signals import degrade
from agentkv_cluster.sim.workload import synthetic_workload
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()


def three_pages():
    # A ends (signal) at 1.0; C's creation at 2.0 needs room: with the signal acted on,
    # A's bytes are already free; without it, a page is evicted.
    return make_batch(sizes_mb=[100, 100, 100], created=[0.0, 0.5, 2.0],
                      reads=[[], [3.0], []], capacity_mb=200, eol=[1.0, 3.0, 4.0])


@pytest.mark.parametrize("name", BASELINES)
def test_fair_baselines_free_signalled_pages_in_the_event_loop(name):
    fair = BatchRun(three_pages(), driver_factory(name, CFG, signals=ALL_SIGNALS)(
        three_pages())).run()
    paper = BatchRun(three_pages(), driver_factory(name, CFG)(three_pages())).run()
    assert fair.retired_pages == 3 and fair.demoted_bytes == 0
    assert paper.retired_pages == 0 and paper.demoted_bytes >= 100 * MB


def test_a_false_signal_costs_the_read_a_recompute():
    batch = dataclasses.replace(three_pages(), false_signal_at=np.array([np.inf, 1.0, np.inf]),
                                recompute_s=np.array([0.1, 0.25, 0.1]))
    fair = BatchRun(batch, driver_factory("lru", CFG, signals=ALL_SIGNALS)(batch)).run()
    assert fair.false_signal_reads == 1 and fair.false_signal_ms == pytest.approx(250.0)
    assert fair.access_visible_ms == [pytest.approx(250.0)]
    paper = BatchRun(batch, driver_factory("lru", CFG)(batch)).run()  # ignores every signal
    assert paper.false_signal_reads == 0 and paper.access_hit == [True]


def test_delivered_signals_are_never_earlier_than_their_event():
    wl = synthetic_workload(SimConfig(workload=WorkloadConfig(batches=60)))
    q = SignalQuality(miss=0.3, delay_s=0.7, false_rate=0.2)
    lost = total = false = 0
    for b in wl:
        d = degrade(b, q, seed=0)
        sent = np.isfinite(d.signal_at)
        assert (d.signal_at[sent] == b.eol[sent] + 0.7).all()
        lost += int((~sent).sum())
        total += b.n_pages
        for i in np.flatnonzero(np.isfinite(d.false_signal_at)):
            reads = b.access_times[i]
            assert len(reads) and b.created[i] <= d.false_signal_at[i] < reads[-1]
            false += 1
        again = degrade(b, q, seed=0)  # common random numbers across policies
        assert np.array_equal(again.signal_at, d.signal_at)
    assert lost / total == pytest.approx(0.3, abs=0.03)
    assert false > 0


def test_signal_quality_rejects_bad_values():
    for kw in ({"miss": 1.5}, {"false_rate": -0.1}, {"delay_s": -1.0},
               {"delay_s": float("nan")}):
        with pytest.raises(SignalQualityError):
            SignalQuality(**kw)


def _decisions(cfg, batches, name, fair=False):
    """Every decision a policy made over ``batches`` (one run: AgentKV's predictor
    learns across them): victims, forms, retirements, prefetches."""
    factory = driver_factory(name, cfg, signals=ALL_SIGNALS if fair else ())
    out = []
    for batch in batches:
        run = BatchRun(batch, factory(batch))
        tr = run.run()
        forms = [(s.demotion.tier, s.demotion.codec, s.demotion.reference)
                 if s.demotion else None for s in run.slots]
        out.append((tr.demoted_bytes, tr.transfer_bytes, tr.access_hit, tr.retired_pages,
                    tr.wasted_prefetch_bytes, forms, [s.demotions for s in run.slots]))
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_no_policy_reads_a_generator_only_field(name):
    """Change only what the generator knows (per-type reuse rate, recompute rate and
    correctness weight, and each page's true recompute time and weight) and keep every
    observable: the policy's decisions must not change. A policy that reads
    ``reuse_prob`` or the exact recompute time from the generator fails here."""
    cfg = SimConfig(workload=WorkloadConfig(batches=120))
    wl = deliver(synthetic_workload(cfg), cfg)
    other_types = {t: dataclasses.replace(p, reuse_prob=1.0 - p.reuse_prob,
                                          recompute_ms_per_mb=p.recompute_ms_per_mb * 7.0,
                                          correctness_weight=1.0 - p.correctness_weight)
                   for t, p in DEFAULT_TYPES.items()}
    cfg_b = cfg.replace(workload=dataclasses.replace(cfg.workload, types=other_types))
    twins = [dataclasses.replace(b, recompute_s=b.recompute_s * 7.0,
                                 correctness=1.0 - b.correctness) for b in wl]
    for fair in (False, True) if name in BASELINES else (False,):
        assert _decisions(cfg, wl, name, fair) == _decisions(cfg_b, twins, name, fair)


def test_compare_reports_fair_policies_with_the_same_keys_and_margins():
    cfg = SimConfig(workload=WorkloadConfig(batches=40))
    result = compare(cfg, fair=True)
    assert set(result.fair_policies) == set(result.policies)
    assert result.fair_policies["agentkv"] is result.policies["agentkv"]
    for name in BASELINES:
        assert result.policies[name].retired_pages_per_batch == 0.0
        assert result.fair_policies[name].retired_pages_per_batch > 0.0
        # acting on perfect signals only removes dead pages: fewer bytes move
        assert (result.fair_policies[name].transfer_mb_per_batch
                <= result.policies[name].transfer_mb_per_batch)
    margins = result.to_dict()["agentkv_vs_strongest"]
    best = min(m.p95_ms for n, m in [*result.policies.items(), *result.fair_policies.items()]
               if n != "agentkv")
    assert margins["p95_ms"]["baseline"] == pytest.approx(best, abs=1e-6)


def test_signal_types_follow_the_page_type():
    from agentkv_cluster.sim.workload import SIGNAL_ORDER, TYPE_ORDER

    (b,) = synthetic_workload(SimConfig(workload=WorkloadConfig(batches=1))).batches
    kinds = {TYPE_ORDER[t]: SIGNAL_ORDER[k].value for t, k in zip(b.types, b.eol_kind)}
    if S.FAILED_BRANCH in kinds:
        assert kinds[S.FAILED_BRANCH] == "branch_abandoned"
    if S.FIXED_PREFIX in kinds:
        assert kinds[S.FIXED_PREFIX] == "task_end"
