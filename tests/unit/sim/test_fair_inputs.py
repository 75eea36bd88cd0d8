"""Every policy runs on the same simulated hardware and, when fair, on the same
signals: a baseline's restores follow the configured link as AgentKV's do, a fair
baseline acts on every kind of end-of-life signal, ARC's ghosts are sized to the
batch's own HBM budget."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.sim.agentkv_driver import AgentKvDriver
from agentkv_cluster.sim.config import MB, LinkConfig, SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import BatchRun
from agentkv_cluster.sim.policies import BASELINES, driver_factory
from agentkv_cluster.sim.runner import run_policy
from agentkv_cluster.sim.workload import SIGNAL_ORDER, Workload
from store.types import Codec, Tier
from tests.unit.sim.conftest import make_batch

SLOW_LINK = SimConfig(link=LinkConfig(bandwidth_gbps=12.0, fixed_overhead_ms=2.0),
                      compression_ratio=4.0)


def test_a_baseline_restore_takes_the_configured_link_time():
    # LRU evicts A (120 MB) at C's production; A's read restores it over a 12 GB/s link
    # with 2 ms fixed cost: 2 + 10 ms
    batch = make_batch(sizes_mb=[120, 120, 120], created=[0.0, 0.1, 0.2],
                       reads=[[5.0], [], []], capacity_mb=250)
    tr = BatchRun(batch, FullPrecisionDriver(LruPolicy(), SLOW_LINK)).run()
    assert tr.access_restore_ms == pytest.approx([12.0])


@pytest.mark.parametrize("tier, codec", [(Tier.HOST, Codec.FULL), (Tier.HOST, Codec.INT4),
                                         (Tier.NVME, Codec.FULL)])
def test_baselines_and_agentkv_price_a_restore_with_one_cost_model(tier, codec):
    baseline = FullPrecisionDriver(LruPolicy(), SLOW_LINK).cost
    agentkv = AgentKvDriver(SLOW_LINK, Mechanisms(), Predictor()).cost
    assert baseline == agentkv
    assert baseline.restore_time(120 * MB, tier, codec) == \
        agentkv.restore_time(120 * MB, tier, codec)
    assert agentkv.codec_ratio[Codec.INT4] == pytest.approx(1 / 4.0)


def _one_page_per_signal():
    n = len(SIGNAL_ORDER)
    batch = make_batch(sizes_mb=[10] * n, created=[0.0] * n, reads=[[]] * n,
                       capacity_mb=100, eol=[1.0] * n)
    return dataclasses.replace(batch, eol_kind=np.arange(n, dtype=np.int8))


@pytest.mark.parametrize("name", BASELINES)
def test_a_fair_baseline_acts_on_every_kind_of_signal(name):
    wl = Workload(source="hand", batches=[_one_page_per_signal()])
    cfg = SimConfig()
    assert run_policy(wl, cfg, name, fair=True).retired_pages_per_batch == len(SIGNAL_ORDER)
    assert run_policy(wl, cfg, name).retired_pages_per_batch == 0
    assert run_policy(wl, cfg, "agentkv").retired_pages_per_batch == len(SIGNAL_ORDER)


def test_arc_ghosts_are_sized_to_the_batch_budget():
    batch = make_batch(sizes_mb=[100, 100, 100], created=[0.0, 1.0, 2.0],
                       reads=[[], [], []], capacity_mb=150)
    policy = driver_factory("arc", SimConfig())(batch).policy
    assert policy.capacity == batch.capacity_bytes == 150 * MB
