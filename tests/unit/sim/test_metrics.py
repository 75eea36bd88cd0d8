"""Metric definitions on hand-made traces."""

from __future__ import annotations

import pytest

from agentkv_cluster.sim.config import MB
from agentkv_cluster.sim.drivers import Demotion
from agentkv_cluster.sim.engine import BatchTrace
from agentkv_cluster.sim.metrics import summarize, wrong_eviction_weight
from store.types import Codec, Tier


def test_summary_of_a_known_trace():
    tr = BatchTrace()
    # 4 reads: a 100 MB hit, a 50 MB fully hidden prefetch, a half-hidden one, a cold restore
    tr.access_bytes = [100 * MB, 50 * MB, 50 * MB, 100 * MB]
    tr.access_hit = [True, False, False, False]
    tr.access_visible_ms = [0.0, 0.0, 1.0, 4.0]
    tr.access_restore_ms = [0.0, 2.0, 2.0, 4.0]
    tr.access_risk = [0.0, 0.1, 0.2, 0.3]
    tr.access_weight = [1.0, 0.2, 0.5, 0.8]
    tr.access_wrong = [0.0, 0.0, 0.5, 1.6]
    tr.transfer_bytes = 300 * MB
    tr.demoted_bytes = 200 * MB
    m = summarize(tr, batches=2)
    assert m.byte_hit_pct == pytest.approx(100 / 300 * 100)
    assert m.p50_ms == pytest.approx(0.5)  # numpy linear interpolation of [0, 0, 1, 4]
    assert m.p99_ms == pytest.approx(1.0 + 0.97 * 3.0)
    assert m.hidden_pct == pytest.approx((1.0 + 0.5 + 0.0) / 3 * 100)
    assert m.transfer_mb_per_batch == 150.0 and m.demoted_mb_per_batch == 100.0
    assert m.risk_pct == pytest.approx(15.0)
    assert m.wrong_eviction_pct == pytest.approx(2.1 / 2.3 * 100)  # weights >= 0.5 only
    assert m.reads == 4


def test_empty_trace_is_all_zero():
    m = summarize(BatchTrace(), batches=1)
    assert (m.p95_ms, m.byte_hit_pct, m.hidden_pct, m.reads) == (0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize("weight, demotion, expected", [
    (0.4, Demotion(tier=Tier.HOST, codec=Codec.INT4, stored_bytes=1), 0.0),  # not high value
    (0.8, Demotion(tier=Tier.HOST, codec=Codec.FULL, stored_bytes=1), 0.8),  # reversible
    (0.8, Demotion(tier=Tier.HOST, codec=Codec.INT4, stored_bytes=1, reference=True), 0.8),
    (0.8, Demotion(tier=Tier.HOST, codec=Codec.INT4, stored_bytes=1), 0.8 * (1 + 3 / 6)),
    (1.0, Demotion(tier=Tier.NVME, codec=Codec.RECOMPUTE, stored_bytes=0), 1.0 * (1 + 6 / 6)),
])
def test_wrong_eviction_weight(weight, demotion, expected):
    assert wrong_eviction_weight(weight, demotion) == pytest.approx(expected)
