"""The event loop with real baseline policies on hand-built batches: exact bookkeeping."""

from __future__ import annotations

import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.baselines import LruPolicy, SemanticPolicy
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import IN_HBM, LOWER, BatchRun
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()


def full_restore_ms(size_mb: float) -> float:
    return 1.2 + size_mb * MB / 24e9 * 1e3


def test_lru_evicts_oldest_and_restores_at_full_precision():
    # capacity 250 MB: A(100) B(100) fit, C(100) evicts A; A's read restores it (evicting B).
    batch = make_batch(sizes_mb=[100, 100, 100], created=[0.0, 1.0, 2.0],
                       reads=[[5.0], [], [6.0]], capacity_mb=250)
    run = BatchRun(batch, FullPrecisionDriver(LruPolicy(), CFG))
    trace = run.run()
    assert trace.access_hit == [False, True]
    assert trace.access_visible_ms[0] == pytest.approx(full_restore_ms(100))
    assert trace.access_visible_ms[1] == 0.0
    assert trace.transfer_bytes == 100 * MB
    assert trace.demoted_bytes == 200 * MB  # A at t=2, B at t=5
    assert [s.where for s in run.slots] == [IN_HBM, LOWER, IN_HBM]
    assert run.used == 200 * MB <= batch.capacity_bytes


def test_jitter_and_link_queueing_add_to_the_visible_delay():
    # Two evicted pages read at the same instant share one link: the second waits.
    batch = make_batch(sizes_mb=[120, 120, 120, 120], created=[0.0, 0.0, 1.0, 1.0],
                       reads=[[3.0], [3.0], [], []], capacity_mb=250,
                       jitter_ms=[0.5, 0.25, 0.0, 0.0])
    trace = BatchRun(batch, FullPrecisionDriver(LruPolicy(), CFG)).run()
    first = full_restore_ms(120) + 0.5
    second = first + full_restore_ms(120) + 0.25
    assert trace.access_visible_ms == pytest.approx([first, second])


def test_semantic_keeps_high_priority_types():
    types = [StateType.FIXED_PREFIX, StateType.FAILED_BRANCH, StateType.TEMP_REASONING]
    batch = make_batch(sizes_mb=[100, 100, 100], created=[0.0, 1.0, 2.0],
                       reads=[[5.0], [], []], capacity_mb=250, types=types)
    trace = BatchRun(batch, FullPrecisionDriver(SemanticPolicy(), CFG)).run()
    assert trace.access_hit == [True]  # the failed branch was evicted, not the prefix


def test_page_larger_than_free_space_with_nothing_evictable_goes_to_lower_tier():
    batch = make_batch(sizes_mb=[200], created=[0.0], reads=[[1.0]], capacity_mb=100)
    run = BatchRun(batch, FullPrecisionDriver(LruPolicy(), CFG))
    trace = run.run()
    assert trace.overflow_events == 2  # at creation and again at the read
    assert trace.access_hit == [False]
    assert run.used == 0


def test_end_of_life_drops_dependency_but_baselines_keep_the_page():
    batch = make_batch(sizes_mb=[50], created=[0.0], reads=[[]], capacity_mb=100,
                       eol=[1.0])
    run = BatchRun(batch, FullPrecisionDriver(LruPolicy(), CFG))
    run.run()
    assert run.slots[0].view.dependency == 0.0
    assert run.slots[0].where == IN_HBM


@pytest.mark.parametrize("name", ["lru", "ttl", "semantic", "agentkv", "arc"])
def test_simulator_and_policy_agree_on_resident_bytes_within_budget(name):
    from agentkv_cluster.sim.config import WorkloadConfig
    from agentkv_cluster.sim.engine import PREFETCHING
    from agentkv_cluster.sim.policies import driver_factory
    from agentkv_cluster.sim.workload import synthetic_workload

    cfg = SimConfig(workload=WorkloadConfig(batches=30))
    factory = driver_factory(name, cfg)
    for batch in synthetic_workload(cfg):
        run = BatchRun(batch, factory(batch))
        run.run()
        resident = sum(s.view.size_bytes for s in run.slots if s.where in (IN_HBM, PREFETCHING))
        assert run.used == resident == run.policy.resident_bytes()
        assert run.used <= batch.capacity_bytes
