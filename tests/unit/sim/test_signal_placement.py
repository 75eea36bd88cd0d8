"""Where the signal-quality model puts a premature "dead" signal: in one of the page's
remaining idle gaps, the gap drawn uniformly, the time uniformly inside it."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.sim.config import SignalQuality
from agentkv_cluster.sim.signals import degrade
from tests.unit.sim.conftest import make_batch

N = 4000


def _false_signals(reads):
    batch = make_batch(sizes_mb=[1] * N, created=[0.0] * N, reads=[reads] * N,
                       capacity_mb=N)
    d = degrade(batch, SignalQuality(false_rate=1.0), seed=3)
    assert np.isfinite(d.false_signal_at).all()  # every page gets one at rate 1
    return d.false_signal_at


def test_a_false_signal_falls_in_each_gap_equally_often_whatever_its_length():
    # gap 0 is [0, 99], gap 1 is [99, 100]: a time drawn over the whole life would
    # almost never land in the short gap
    at = _false_signals([99.0, 100.0])
    assert (at < 100.0).all()
    assert np.mean(at >= 99.0) == pytest.approx(0.5, abs=0.04)


def test_inside_its_gap_a_false_signal_is_placed_uniformly():
    at = _false_signals([10.0, 20.0, 30.0])
    gap = np.floor(at / 10.0)
    assert np.bincount(gap.astype(int), minlength=3) / N == pytest.approx([1 / 3] * 3,
                                                                          abs=0.04)
    offset = at - gap * 10.0
    assert np.mean(offset) == pytest.approx(5.0, abs=0.3)
