"""The per-read proxies the loop records: the §3.2 risk proxy weighs how wrong the
gap prediction was, early or late alike, and is 0 for a reversible form's depth 0; the
hidden fraction is a number even when a restore took no time."""

from __future__ import annotations

import math

import pytest

from agentkv_cluster.policy.risk import RiskController
from agentkv_cluster.sim.drivers import Demotion
from agentkv_cluster.sim.engine import BatchTrace
from agentkv_cluster.sim.metrics import risk_of_read, summarize
from store.types import Codec, Tier

INT4 = Demotion(tier=Tier.HOST, codec=Codec.INT4, stored_bytes=1)


def test_a_read_earlier_than_predicted_is_as_risky_as_one_as_much_later():
    depth = RiskController.demotion_depth(Tier.HOST, Codec.INT4)
    early = risk_of_read(0.8, INT4, predicted_idle_s=4.0, actual_idle_s=1.0)
    late = risk_of_read(0.8, INT4, predicted_idle_s=1.0, actual_idle_s=4.0)
    assert early == pytest.approx(late) == pytest.approx(math.log(4.0) * 0.8 * depth)
    assert early > 0.0


def test_a_read_on_time_carries_no_risk():
    assert risk_of_read(1.0, INT4, predicted_idle_s=2.5, actual_idle_s=2.5) == 0.0


def test_a_restore_that_took_no_time_leaves_the_hidden_fraction_a_number():
    """0 of 0 ms hidden was NaN, which the report writer refuses (found by review)."""
    trace = BatchTrace(access_bytes=[10, 10], access_hit=[False, False],
                       access_visible_ms=[0.0, 1.0], access_restore_ms=[0.0, 4.0],
                       access_risk=[0.0, 0.0], access_weight=[0.0, 0.0],
                       access_wrong=[0.0, 0.0])
    assert summarize(trace, 1).hidden_pct == pytest.approx(75.0)  # the 0 ms one left out
