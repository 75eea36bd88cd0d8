"""Return model (P(a silent page is read again), learned from how gaps ended) and the
cost-aware prefetch rule built on it (gap planner, prefetch admission)."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy
from agentkv_cluster.policy.base import CostModel, ToolStart
from agentkv_cluster.policy.gap import GapConfig, GapPlanner
from agentkv_cluster.policy.predictor import Predictor, PredictorConfig
from agentkv_cluster.policy.returns import ReturnConfig, ReturnModel
from agentkv_cluster.policy.value import ValueModel
from store.types import Codec, Tier
from tests.unit.policy.builders import page

COST = CostModel(link_bytes_per_s={t: 1e9 for t in Tier},
                 fixed_overhead_s={t: 0.0 for t in Tier}, codec_bytes_per_s=float("inf"))


def silent(pid: int, last_access: float = 0.0, reuse: float = 0.5, **fields: object):
    return page(pid, session="s", tool_class="think", last_access=last_access,
                reuse_prob=reuse, dependency=1.0, **fields)


def model(returns: list[float], ends: list[float], **cfg: object) -> ReturnModel:
    m = ReturnModel(ReturnConfig(**{"prior": 0.0, "min_outcomes": 1, **cfg}))
    for i, d in enumerate(returns):
        m.observe_return(silent(1000 + i), d)
    for i, d in enumerate(ends):
        m.observe_end(silent(2000 + i), d)
    return m


def test_p_return_is_returns_over_all_gaps_that_lasted_as_long():
    # returns after 10 s, 20 s, 30 s; ends (idle timeout) after 300 s
    m = model([10.0, 20.0, 30.0], [300.0, 300.0, 300.0])
    assert m.p_return(silent(1), now=0.0) == pytest.approx(3 / 6)
    assert m.p_return(silent(1), now=15.0) == pytest.approx(2 / 5)
    assert m.p_return(silent(1), now=40.0) == 0.0  # silent past every return: dead
    # the other way round (signals arrive inside the gap): silence makes a return likelier
    m = model([10.0, 20.0], [2.0, 3.0, 4.0])
    assert m.p_return(silent(1), now=0.0) == pytest.approx(2 / 5)
    assert m.p_return(silent(1), now=5.0) == 1.0


def test_prior_pulls_toward_the_pages_own_reuse_estimate_and_keys_are_separate():
    m = model([10.0], [300.0], prior=2.0)
    assert m.p_return(silent(1, reuse=0.9), now=0.0) == pytest.approx((1 + 1.8) / 4)
    other = page(5, tool_class="bash", reuse_prob=0.25)  # no outcome of its key yet
    assert m.p_return(other, now=0.0) == pytest.approx(0.25)


def test_open_gaps_count_as_not_yet_returned_and_close_on_their_outcome():
    m = model([10.0], [])
    a, b = silent(1, last_access=0.0), silent(2, last_access=0.0)
    m.open_gap(a, 0.0)
    m.open_gap(b, 0.0)
    # at 5 s: one return beyond 5 s; the other open gap (not the page itself) is silent
    assert m.p_return(a, now=5.0) == pytest.approx(1 / 2)
    m.observe_return(b, 6.0)  # b's gap closes as a return
    assert m.p_return(a, now=5.0) == pytest.approx(2 / 2)
    assert m.close_open_gaps(now=50.0) == 1  # a never came back: an end after 50 s
    assert m.p_return(silent(3), now=20.0) == pytest.approx(0 / 1)


def test_a_forgotten_gap_counts_for_nothing_and_leaves_no_entry():
    """Tenant erasure: the page's open gap is dropped without an outcome; left open it
    would count against every page of its kind as a gap that never ended."""
    m = model([10.0], [])
    a, gone = silent(1, last_access=0.0), silent(2, last_access=0.0)
    m.open_gap(a, 0.0)
    m.open_gap(gone, 0.0)
    assert m.p_return(a, now=5.0) == pytest.approx(1 / 2)  # gone's gap counts against a
    assert m.forget(gone.page_id) and not m.forget(gone.page_id)
    assert m.p_return(a, now=5.0) == pytest.approx(1 / 1)
    observed = m.observed
    assert m.close_open_gaps(now=50.0) == 1 and m.observed == observed + 1  # a's only


def test_a_forgotten_tool_class_keeps_no_outcome_and_other_classes_stay():
    m = model([10.0], [300.0], prior=1.0)
    other = page(5, session="s", tool_class="bash", reuse_prob=0.25)
    m.observe_return(other, 4.0)
    mine = silent(1, reuse=0.3)
    assert m.p_return(mine, now=0.0) == pytest.approx((1 + 0.3) / 3)  # "think" outcomes
    m.forget_tool("think")
    assert m.p_return(mine, now=0.0) == pytest.approx(0.3)  # the prior alone
    assert m.p_return(other, now=0.0) == pytest.approx((1 + 0.25) / 2)  # "bash" keeps its own


def test_window_forgets_the_oldest_outcomes():
    m = model([1.0] * 4, [100.0] * 4, window=4)
    assert m.p_return(silent(1), now=0.0) == 0.0  # only the four ends remain


def test_cost_aware_rule_weighs_link_time_and_displacement():
    m = model([10.0] * 3, [300.0] * 2)  # P = 0.6 at the gap's start
    p = silent(1, size_mb=100)
    assert m.worth_prefetching(p, 0.0, restore_s=0.1)  # 0.6 x 0.1 >= 0.4 x 0.1
    # displacing as many bytes as it brings doubles the cost: 0.06 < 0.08
    assert not m.worth_prefetching(p, 0.0, restore_s=0.1, displaced_bytes=p.size_bytes)
    assert not m.worth_prefetching(p, 15.0, restore_s=0.1)  # past every return


def test_bad_durations_and_configs_are_refused():
    with pytest.raises(ValueError):
        ReturnModel().observe_return(silent(1), -1.0)
    with pytest.raises(ValueError):
        ReturnConfig(window=0)


def test_gap_planner_skips_prefetches_the_return_model_rejects():
    pred = Predictor(PredictorConfig(prior_median_s=10.0, prior_sigma=1.0))
    start = ToolStart(session="s", call_id="c", tool_class="think", started_at=0.0)

    def plan(returns: ReturnModel | None):
        gp = GapPlanner(COST, pred, ValueModel(cost=COST),
                        config=GapConfig(codec=Codec.FULL), returns=returns)
        pg = silent(1, reuse=0.9, size_mb=100)
        return gp.plan(start, [pg], now=0.0)

    assert len(plan(None).prefetches) == 1  # the reuse floor alone: prefetched
    untrained = ReturnModel()  # no outcome yet: the reuse floor still decides
    assert len(plan(untrained).prefetches) == 1
    dead = model([1.0] * 20, [300.0] * 20)  # returns come within 1 s or never
    assert plan(dead).prefetches == ()
    alive = model([10.0] * 20, [300.0] * 2)
    assert len(plan(alive).prefetches) == 1


def test_admission_refuses_a_prefetch_that_does_not_pay():
    returns = model([1.0] * 20, [300.0] * 20)
    policy = AgentKvPolicy(AgentKvConfig(cost=COST), returns=returns)
    pg = silent(1, size_mb=10, tier=Tier.HOST, codec=Codec.FULL)
    got = policy.admit_prefetch(pg, need_bytes=0, now=5.0)  # silent past every return
    assert not got.admitted and 1 not in policy
    fresh = ReturnModel()  # untrained: admitted as before
    policy = AgentKvPolicy(AgentKvConfig(cost=COST), returns=fresh)
    assert policy.admit_prefetch(pg, need_bytes=0, now=5.0).admitted
