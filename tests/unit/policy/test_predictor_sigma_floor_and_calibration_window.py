"""Tool-duration law (paper §2.2, historical tool-duration quantiles): the fitted
log-normal never gets narrower than ``min_sigma``, so a tool that always took the
same time still predicts some spread of its idle gap."""

from __future__ import annotations

import math

import pytest

from agentkv_cluster.policy.predictor import PredictorConfig, ToolDurations


def test_identical_durations_fit_no_narrower_than_min_sigma():
    cfg = PredictorConfig()  # prior median 2 s, prior sigma 1, prior weight 4, min_sigma 0.05
    tools = ToolDurations(cfg)
    n = 10_000
    for _ in range(n):
        tools.observe("grep", 2.0)  # log 2 = the prior's mu: only the prior adds variance
    law = tools.distribution("grep")
    # blended variance by hand: (k * sigma0^2 + m2 + k n/(k+n) (mean - mu0)^2) / (k + n)
    #                          = (4 * 1 + 0 + 0) / 10004 -> sigma 0.019996 < 0.05
    assert math.sqrt(4 / (4 + n)) < cfg.min_sigma
    assert law.mu == pytest.approx(math.log(2.0))
    assert law.sigma == pytest.approx(cfg.min_sigma)
    # 90th percentile: 2 * exp(0.05 * z_0.9), z_0.9 = 1.2815515655446004
    assert law.quantile(0.9) == pytest.approx(2.0 * math.exp(0.05 * 1.2815515655446004))


def test_calibration_error_forgets_outcomes_that_left_the_window():
    from agentkv_cluster.policy.predictor import Calibration

    cal = Calibration(window=2)
    cal.record(0.9, False)
    cal.record(0.9, False)
    assert cal.calibration_error() == pytest.approx(0.9)  # bin [0.9,1): |1.8 - 0| / 2
    cal.record(0.15, False)
    cal.record(0.15, False)  # the two 0.9 forecasts have left the window
    # ECE over the window only: one bin [0.1, 0.2) holding 0.15, 0.15 with no reuse
    # -> |0.30 - 0| / 2 = 0.15 (the Brier score agrees: 0.15^2 = 0.0225)
    assert cal.calibration_error() == pytest.approx(0.15)
    assert cal.brier() == pytest.approx(0.0225)
    assert [(b.count, b.observed_rate) for b in cal.reliability()] == [(2, 0.0)]
