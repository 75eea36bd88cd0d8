"""Predictor: features, eq. 2, online tool-duration law, calibration, confidence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS
from agentkv_cluster.policy.base import StateType
from agentkv_cluster.policy.predictor import (
    FEATURE_NAMES,
    Calibration,
    LogNormal,
    Predictor,
    PredictorConfig,
    ReliabilityBin,
    ToolDurations,
)
from tests.unit.policy.builders import page


def test_brier_score_known_case():
    cal = Calibration(window=10)
    for p, y in [(0.9, True), (0.1, False), (0.8, False)]:
        cal.record(p, y)
    assert cal.brier() == pytest.approx((0.01 + 0.01 + 0.64) / 3)


def test_brier_needs_data_and_window_is_bounded():
    cal = Calibration(window=2)
    with pytest.raises(ValueError):
        cal.brier()
    for p, y in [(0.0, True), (1.0, True), (1.0, True)]:
        cal.record(p, y)
    assert cal.brier() == 0.0  # the (0.0, True) pair fell out of the window


def test_reliability_table_exact():
    cal = Calibration(window=100)
    for p, y in [(0.05, False), (0.15, False), (0.15, True), (0.95, True), (1.0, True)]:
        cal.record(p, y)
    assert cal.reliability(bins=10) == [
        ReliabilityBin(lo=0.0, hi=0.1, count=1, mean_predicted=0.05, observed_rate=0.0),
        ReliabilityBin(lo=0.1, hi=0.2, count=2, mean_predicted=0.15, observed_rate=0.5),
        ReliabilityBin(lo=0.9, hi=1.0, count=2, mean_predicted=0.975, observed_rate=1.0),
    ]


def test_initial_reuse_probability_is_the_type_prior():
    pred = Predictor()
    for state_type in StateType:
        p = page(1, state_type=state_type, last_access=0.0, branch_confidence=1.0)
        # only the one-hot type and tool-quantile features are non-zero; tool weights start at 0
        assert pred.predict(p, now=0.0).p_reuse == pytest.approx(
            TYPE_DEFAULTS[state_type].reuse_prob)


def test_features_have_the_named_layout():
    pred = Predictor()
    p = page(1, state_type=StateType.TOOL_OBSERVATION, last_access=1.0, task_depth=3,
             successors=2, prefix_share=4, recompute_tokens=99)
    phi = pred.features(p, now=1.0 + math.e - 1.0, queue_pressure=0.25)
    named = dict(zip(FEATURE_NAMES, phi.tolist()))
    assert len(phi) == len(FEATURE_NAMES)
    assert named["type:tool_observation"] == 1.0
    assert sum(named[f"type:{t.value}"] for t in StateType) == 1.0
    assert named["log_since_last_event"] == pytest.approx(1.0)
    assert named["task_depth"] == pytest.approx(0.3)
    assert named["successors"] == pytest.approx(0.2)
    assert named["log_prefix_share"] == pytest.approx(math.log(4))
    assert named["log_recompute_tokens"] == pytest.approx(math.log(100) / 10)
    assert named["queue_pressure"] == 0.25
    assert named["log_tool_p50"] == pytest.approx(math.log1p(2.0))  # the prior median


def test_online_updates_move_reuse_towards_outcomes_and_improve_brier():
    pred = Predictor(PredictorConfig(learning_rate=0.2))
    branch = page(1, state_type=StateType.FAILED_BRANCH)
    before = pred.predict(branch, now=0.0).p_reuse
    for _ in range(200):
        pred.observe_reuse(branch, reused=True, now=0.0)
    assert pred.predict(branch, now=0.0).p_reuse > 0.9 > before
    assert len(pred.calibration) == 200
    first, last = pred.calibration.reliability(bins=10)[0], pred.calibration.reliability()[-1]
    assert first.mean_predicted < 0.2 and last.mean_predicted > 0.9


def test_tool_durations_blend_prior_and_data_exactly():
    cfg = PredictorConfig(prior_median_s=1.0, prior_sigma=1.0, prior_weight=2)
    tools = ToolDurations(cfg)
    assert tools.distribution("grep") == LogNormal(mu=0.0, sigma=1.0, n=0)
    for d in (math.e, math.e**3):  # log durations 1 and 3: mean 2, M2 = 2
        tools.observe("grep", d)
    law = tools.distribution("grep")
    # mu = (2*0 + 2*2) / 4 = 1; var = (2*1 + 2 + 2*2/4 * 4) / 4 = 2
    assert (law.mu, law.sigma, law.n) == (pytest.approx(1.0), pytest.approx(math.sqrt(2)), 2)
    assert law.quantile(0.5) == pytest.approx(math.e)
    with pytest.raises(ValueError):
        tools.observe("grep", 0.0)


def test_fitted_quantiles_converge_to_the_true_law():
    rng = np.random.default_rng(1)
    tools = ToolDurations(PredictorConfig())
    for d in rng.lognormal(mean=1.5, sigma=0.6, size=4000):
        tools.observe("search", float(d))
    law = tools.distribution("search")
    assert law.quantile(0.5) == pytest.approx(math.exp(1.5), rel=0.03)
    assert law.quantile(0.9) == pytest.approx(math.exp(1.5 + 0.6 * 1.2815516), rel=0.05)


def test_remaining_idle_grows_in_the_heavy_tail():
    law = LogNormal(mu=0.0, sigma=1.5, n=10)
    assert law.remaining_quantile(0.5, 0.0) == pytest.approx(1.0)
    medians = [law.remaining_quantile(0.5, e) for e in (0.0, 1.0, 5.0, 20.0)]
    assert medians == sorted(medians)
    assert medians[-1] > 5 * medians[0]


def test_confidence_threshold_drives_the_conservative_flag():
    pred = Predictor(PredictorConfig(prior_weight=4, confidence_threshold=0.5))
    p = page(1, tool_class="pytest")
    assert pred.predict(p, now=0.0).confident is False  # no data: confidence 0
    for d in (1.0, 2.0, 3.0, 4.0):
        pred.observe_tool("pytest", d)
    prediction = pred.predict(p, now=0.0)
    assert prediction.confidence == pytest.approx(0.5)  # 4 / (4 + 4)
    assert prediction.confident is True
    assert set(prediction.idle_quantiles) == {0.5, 0.9, 0.99}
    # a badly calibrated reuse model caps confidence at its skill: always wrong -> 0
    for _ in range(40):
        pred.observe_reuse(page(2, state_type=StateType.FIXED_PREFIX), reused=False, now=0.0)
    assert pred.confidence("pytest") < 0.5


def test_predicted_idle_quantiles_are_residual_given_time_already_idle():
    pred = Predictor(PredictorConfig(prior_median_s=4.0, prior_sigma=1.2))
    law = pred.tools.distribution("build")
    p = page(1, tool_class="build", last_access=10.0)
    fresh = pred.predict(p, now=10.0).idle_quantiles
    late = pred.predict(p, now=30.0).idle_quantiles
    assert fresh[0.5] == pytest.approx(4.0)
    assert late == {q: pytest.approx(law.remaining_quantile(q, 20.0)) for q in (0.5, 0.9, 0.99)}
    assert late[0.5] > fresh[0.5] and fresh[0.5] < fresh[0.9] < fresh[0.99]


def test_gap_estimate_is_anchored_at_the_last_access():
    from agentkv_cluster.policy.base import remaining_idle_s

    pred = Predictor(PredictorConfig(prior_median_s=4.0, prior_sigma=1.0))
    view = page(1, tool_class="pytest", last_access=10.0)
    law = pred.tools.distribution("pytest")
    assert pred.gap_estimate(view, now=10.0) == pytest.approx(4.0)
    view.predicted_idle_s = pred.gap_estimate(view, now=13.0)
    assert view.predicted_idle_s == pytest.approx(3.0 + law.remaining_quantile(0.5, 3.0))
    assert remaining_idle_s(view, now=13.0) == pytest.approx(law.remaining_quantile(0.5, 3.0))
