"""Tool-gap migration (paper §2.4): a short gap moves only pages the gap hides, and a
more valuable page needs more slack: it joins the first wave whose remaining predicted gap
is at least (1 + value_slack x value rank) x T_move, so it moves later in the tool's tail."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.base import CostModel, StateType, ToolStart
from agentkv_cluster.policy.gap import GapConfig, GapPlanner
from agentkv_cluster.policy.predictor import Predictor, PredictorConfig
from agentkv_cluster.policy.value import ValueModel
from store.types import Codec, Tier
from tests.unit.policy.builders import page

# 1 GB/s links, no fixed overhead, free codecs: T_move(FULL) = 2 * size / 1e9 exactly
COST = CostModel(link_bytes_per_s={t: 1e9 for t in Tier},
                 fixed_overhead_s={t: 0.0 for t in Tier}, codec_bytes_per_s=float("inf"))
START = ToolStart(session="s", call_id="c1", tool_class="pytest", started_at=100.0)


def test_the_more_valuable_page_waits_for_a_gap_of_twice_its_move_time():
    pred = Predictor(PredictorConfig(prior_median_s=10.0, prior_sigma=1.0))
    gp = GapPlanner(COST, pred, ValueModel(cost=COST),
                    config=GapConfig(codec=Codec.FULL, value_slack=2.0,
                                     wave_fractions=(1.0,) * 5))
    pages = []
    for pid, recompute in ((1, 0.0), (2, 100.0)):  # page 2 is denser: value rank 1/2
        p = page(pid, session="s", reuse_prob=0.9, dependency=0.5, recompute_cost_s=recompute)
        p.size_bytes = 3 * 10**9  # T_move = 2 x 3 GB / (1 GB/s) = 6 s
        pages.append(p)
    plan = gp.plan(START, pages, now=100.0)
    got = {m.page_id: m for m in plan.migrations}
    law = pred.tools.distribution("pytest")
    # wave 0 starts now with a residual median gap of 10 s (the prior median)
    assert law.remaining_quantile(0.5, 0.0) == pytest.approx(10.0)
    # rank 0: slack 1 -> needs 6 s <= 10 s: moves now
    assert got[1].start_at == 100.0
    # rank 1/2: slack 1 + 2 x 0.5 = 2 -> needs 12 s > 10 s: the first later wave whose
    # residual median gap reaches 12 s
    first = None
    for q in (0.5, 0.75, 0.9, 0.97):
        elapsed = law.quantile(q)
        if law.remaining_quantile(0.5, elapsed) >= 12.0:
            first = 100.0 + elapsed
            break
    assert first is not None
    assert got[2].start_at == pytest.approx(first)
    assert got[2].start_at > 100.0


def test_a_prefetch_never_starts_before_its_page_has_been_moved_out():
    # three 2 GB pages (T_move 4 s each) all move at 100 s in wave 0 (residual gap 10 s).
    # Back to back, their prefetches would start at 110 - 12 = 98 s: before the page is
    # even evicted and compressed (half of T_move, i.e. 102 s). The first therefore starts
    # at 102 s and the others follow back to back in position order: 106 s, 110 s.
    pred = Predictor(PredictorConfig(prior_median_s=10.0, prior_sigma=1.0))
    gp = GapPlanner(COST, pred, ValueModel(cost=COST),
                    config=GapConfig(codec=Codec.FULL, value_slack=0.0,
                                     wave_fractions=(1.0,) * 5))
    pages = []
    for pid in (1, 2, 3):
        p = page(pid, session="s", reuse_prob=0.9, dependency=0.5, position=pid * 100,
                 tokens=100)
        p.size_bytes = 2 * 10**9
        pages.append(p)
    plan = gp.plan(START, pages, now=100.0)
    assert [m.start_at for m in plan.migrations] == [100.0] * 3
    assert all(m.expected_return == pytest.approx(110.0) for m in plan.migrations)
    starts = [(f.page_id, f.start_at) for f in plan.prefetches]
    assert [pid for pid, _ in starts] == [1, 2, 3]
    assert [s for _, s in starts] == pytest.approx([102.0, 106.0, 110.0])


def test_the_working_copy_codec_is_clamped_by_the_risk_decision():
    # GapConfig asks for INT4; a tool observation (no reference copy by type) of
    # correctness 0.6 is capped at INT8 by the risk decision (int8_threshold 0.5), so it
    # moves as INT8: 0.53 of its bytes
    pred = Predictor(PredictorConfig(prior_median_s=10.0, prior_sigma=1.0))
    gp = GapPlanner(COST, pred, ValueModel(cost=COST),
                    config=GapConfig(codec=Codec.INT4, value_slack=0.0,
                                     wave_fractions=(1.0,) * 5))
    obs = StateType.TOOL_OBSERVATION
    risky = page(1, session="s", state_type=obs, reuse_prob=0.9, dependency=0.5,
                 correctness_weight=0.6)
    loose = page(2, session="s", state_type=obs, reuse_prob=0.9, dependency=0.5,
                 correctness_weight=0.3)
    for p in (risky, loose):
        p.size_bytes = 10**9
    got = {m.page_id: m for m in gp.plan(START, [risky, loose], now=100.0).migrations}
    assert got[1].codec is Codec.INT8
    assert got[1].moved_bytes == pytest.approx(0.53e9, abs=1)
    assert got[2].codec is Codec.INT4  # 0.3 >= int4_threshold: INT4 is allowed


def test_weak_future_dependency_moves_first_among_equally_idle_pages():
    # equal remaining idle (50 s): the move key idle / (1 + D) puts D = 0 (50) before
    # D = 3 (12.5) even though the D = 0 page is the more valuable (rank 1/2)
    pred = Predictor(PredictorConfig(prior_median_s=10.0, prior_sigma=1.0))
    gp = GapPlanner(COST, pred, ValueModel(cost=COST), config=GapConfig(codec=Codec.FULL))
    free = page(1, session="s", reuse_prob=0.9, dependency=0.0, recompute_cost_s=100.0,
                last_access=100.0, predicted_idle_s=50.0)
    needed = page(2, session="s", reuse_prob=0.9, dependency=3.0, recompute_cost_s=0.0,
                  last_access=100.0, predicted_idle_s=50.0)
    vm = gp.value_model
    assert vm.density(free, 100.0) > vm.density(needed, 100.0)
    got = {m.page_id: m.start_at for m in gp.plan(START, [free, needed], now=100.0).migrations}
    law = pred.tools.distribution("pytest")
    # wave 0 admits move order < 0.5 (the first page); wave q=0.5 admits < 0.75
    assert got[1] == 100.0
    assert got[2] == pytest.approx(100.0 + law.quantile(0.5))
