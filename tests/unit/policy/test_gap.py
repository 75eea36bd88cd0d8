"""Tool-gap planner, eq. 6: ranking, short gaps, progressive waves, prefetch, early return."""

from __future__ import annotations

import math

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


def planner(median_s: float = 10.0, **gap: object) -> GapPlanner:
    pred = Predictor(PredictorConfig(prior_median_s=median_s, prior_sigma=1.0))
    config = GapConfig(**{"codec": Codec.FULL, **gap})
    return GapPlanner(COST, pred, ValueModel(cost=COST), config=config)


def gb_page(pid: int, gb: float, **fields: object):
    """A page of ``gb`` GB in session "s" whose consumer is still waiting (D = 0.5)."""
    p = page(pid, session="s", reuse_prob=0.9, **{"dependency": 0.5, **fields})
    p.size_bytes = int(gb * 1e9)
    return p


def test_hideable_fraction_is_gap_over_move_time():
    gp = planner(value_slack=0.0, wave_fractions=(1.0,) * 5)
    plan = gp.plan(START, [gb_page(1, 1.0)], now=100.0)
    (m,) = plan.migrations
    assert m.t_move_s == pytest.approx(2.0)
    assert plan.predicted_return == pytest.approx(110.0)  # prior median of the tool
    assert m.hideable == 1.0  # 10 s gap hides a 2 s move
    assert (m.start_at, m.to_tier, m.codec, m.moved_bytes) == (100.0, Tier.HOST, Codec.FULL,
                                                               10**9)


def test_large_pages_migrate_progressively_in_the_long_tail():
    gp = planner(value_slack=0.0, wave_fractions=(1.0,) * 5)
    law = gp.predictor.tools.distribution("pytest")
    waves = []
    for q in (0.0, 0.5, 0.75, 0.9, 0.97):
        start = 100.0 + (law.quantile(q) if q else 0.0)
        waves.append((start, law.remaining_quantile(0.5, start - 100.0)))
    assert waves[-1][1] > 2 * waves[0][1]  # deep in the tail the residual gap is long
    sizes = {1: 2.0, 2: 5.5, 3: 7.5, 4: 13.0}  # T_move = 4, 11, 15, 26 s
    plan = gp.plan(START, [gb_page(pid, gb) for pid, gb in sizes.items()], now=100.0)
    got = {m.page_id: m.start_at for m in plan.migrations}
    for pid, gb in sizes.items():
        first = next((s for s, r in waves if r >= 2 * gb), None)
        assert got.get(pid) == (pytest.approx(first) if first else None)
    assert got[1] == 100.0 and got[1] < got[2] < got[3]  # small first, bigger later
    assert 4 not in got  # 26 s never hides in the predicted gap: it stays in HBM
    m = next(m for m in plan.migrations if m.page_id == 2)
    assert m.expected_return == pytest.approx(m.start_at + dict(waves)[m.start_at])


def test_waves_admit_more_value_ranks_as_the_tool_runs_long():
    gp = planner()  # wave fractions 0.5, 0.75, 0.9, 1.0, 1.0
    law = gp.predictor.tools.distribution("pytest")
    pages = [gb_page(pid, 0.001, recompute_cost_s=float(pid)) for pid in range(4)]
    plan = gp.plan(START, pages, now=100.0)
    starts = {m.page_id: m.start_at for m in plan.migrations}
    assert starts == {0: 100.0, 1: 100.0, 2: pytest.approx(100.0 + law.quantile(0.5)),
                      3: pytest.approx(100.0 + law.quantile(0.75))}  # rank 0.75 < 0.9


def test_short_gap_moves_only_small_low_value_pages():
    gp = planner(median_s=0.5)  # predicted gap 0.5 s < short_gap_s
    pages = [gb_page(1, 0.010), gb_page(2, 0.064),  # low value: sizes 10 MB, 64 MB
             gb_page(3, 0.010, recompute_cost_s=5.0), gb_page(4, 0.010, recompute_cost_s=6.0)]
    plan = gp.plan(START, pages, now=100.0)
    assert [(m.page_id, m.start_at) for m in plan.migrations] == [(1, 100.0)]


def test_ranking_by_idle_time_and_dependency_decides_the_wave():
    gp = planner()  # wave fractions 0.5, 0.75, 0.9, ...
    law = gp.predictor.tools.distribution("pytest")
    pages = [gb_page(1, 0.001, predicted_idle_s=5.0, dependency=4.0),  # score 1: third
             gb_page(2, 0.001, predicted_idle_s=3.0),  # score 3: second
             gb_page(3, 0.001, predicted_idle_s=20.0, dependency=1.0)]  # score 10: first
    plan = gp.plan(START, pages, now=100.0)
    starts = {m.page_id: m.start_at for m in plan.migrations}
    # move-order ranks 0, 1/3, 2/3: the first two fit the first half, the last waits
    assert starts == {3: 100.0, 2: 100.0, 1: pytest.approx(100.0 + law.quantile(0.5))}


def test_excluded_pages():
    gp = planner()
    pages = [gb_page(1, 0.001, pinned=True),
             page(2, session="other"),
             gb_page(3, 0.001, tier=Tier.HOST),
             gb_page(4, 0.001, correctness_weight=0.9, confidence=0.2),  # risk guard
             gb_page(5, 0.001, state_type=StateType.FAILED_BRANCH)]
    plan = gp.plan(START, pages, now=100.0)
    assert [m.page_id for m in plan.migrations] == [5]


def test_single_prefetch_starts_at_return_minus_move_time():
    gp = planner(value_slack=0.0)
    plan = gp.plan(START, [gb_page(1, 1.0)], now=100.0)
    (f,) = plan.prefetches
    assert f.start_at == pytest.approx(plan.predicted_return - 2.0)
    assert (f.from_tier, f.link_credit_bytes, f.moved_bytes) == (Tier.HOST, 10**9, 10**9)
    assert plan.cancel_on_early_return is True


def test_prefetch_off_and_unlikely_pages_are_not_prefetched():
    plan = planner(prefetch=False).plan(START, [gb_page(1, 0.01)], now=100.0)
    assert len(plan.migrations) == 1 and plan.prefetches == ()
    unlikely = gb_page(2, 0.01)
    unlikely.reuse_prob = 0.1
    assert planner().plan(START, [unlikely], now=100.0).prefetches == ()


def test_early_return_cancels_unfinished_prefetch_and_reports_resident_prefix():
    gp = planner(value_slack=0.0, wave_fractions=(1.0,) * 5)
    pages = [gb_page(i, 1.0, position=100 * i, tokens=100) for i in range(3)]
    plan = gp.plan(START, pages, now=100.0)
    starts = [f.start_at for f in plan.prefetches]
    assert [f.page_id for f in plan.prefetches] == [0, 1, 2]  # prefix order, back to back
    assert starts == pytest.approx([110.0 - 6.0, 110.0 - 4.0, 110.0 - 2.0])
    # the tool returns once page 0 has landed (restore 1 s) but before page 1 has
    report = gp.early_return(plan, pages, now=starts[0] + 1.5)
    assert report.cancelled_prefetches == (1, 2)
    assert report.cancelled_migrations == ()
    assert (report.resident_prefix, report.resident_prefix_tokens) == ((0,), 100)


def test_very_early_return_cancels_migrations_not_started():
    gp = planner(value_slack=0.0, wave_fractions=(1.0,) * 5)
    pages = [gb_page(0, 0.001, position=0, tokens=10), gb_page(1, 7.5, position=10, tokens=10)]
    plan = gp.plan(START, pages, now=100.0)
    assert [m.page_id for m in plan.migrations] == [0, 1] and plan.migrations[1].start_at > 101
    report = gp.early_return(plan, pages, now=101.0)
    assert report.cancelled_migrations == (1,)
    assert report.cancelled_prefetches == (0, 1)
    assert (report.resident_prefix, report.resident_prefix_tokens) == ((), 0)
    assert math.isclose(report.returned_at, 101.0)


@pytest.mark.parametrize(
    "bad", [{"wave_fractions": (1.0,)}, {"wave_quantiles": (0.5, 0.0, 0.75, 0.9, 0.97)},
            {"return_quantile": 1.0}])
def test_gap_config_is_validated(bad):
    with pytest.raises(ValueError):
        GapConfig(**bad)


def test_a_page_whose_consumers_are_done_is_moved_but_not_prefetched():
    done = gb_page(1, 0.01, dependency=0.0)
    plan = planner().plan(START, [done, gb_page(2, 0.01)], now=100.0)
    assert {m.page_id for m in plan.migrations} == {1, 2}
    assert [f.page_id for f in plan.prefetches] == [2]
    # without the event dependency mechanism the planner cannot tell: both come back
    blind = planner()
    blind.value_model = ValueModel(cost=COST, use_dependency=False)
    plan = blind.plan(START, [done, gb_page(2, 0.01)], now=100.0)
    assert sorted(f.page_id for f in plan.prefetches) == [1, 2]


def test_move_order_uses_the_idle_time_still_ahead():
    gp = planner()
    law = gp.predictor.tools.distribution("pytest")
    # page 1 predicted the longest gap but has already waited almost all of it
    pages = [gb_page(1, 0.001, predicted_idle_s=20.0, last_access=80.5),  # 0.5 s left
             gb_page(2, 0.001, predicted_idle_s=10.0, last_access=99.0),  # 9 s left
             gb_page(3, 0.001, predicted_idle_s=3.0, last_access=99.0)]  # 2 s left
    plan = gp.plan(START, pages, now=100.0)
    starts = {m.page_id: m.start_at for m in plan.migrations}
    # ranks 0 (page 2) and 1/3 (page 3) fit the first half; page 1 waits for wave two
    assert starts == {2: 100.0, 3: 100.0, 1: pytest.approx(100.0 + law.quantile(0.5))}
