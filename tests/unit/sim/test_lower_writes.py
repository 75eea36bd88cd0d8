"""A page that finds no room in HBM (every resident page pinned, or a page larger than
the budget) is written straight to the lower tier: its bytes cross to that tier like a
demotion's and count in ``demoted_bytes`` for every policy (one shared code path)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentkv_cluster.policy.base import ALL_SIGNALS, PageView
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.engine import LOWER, BatchRun
from agentkv_cluster.sim.policies import POLICY_NAMES, driver_factory
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()


def _pin_page_0(driver):
    make = driver.make_view

    def pinned(**fields: object) -> PageView:
        view = make(**fields)
        view.pinned = view.page_id == 0
        return view

    driver.make_view = pinned
    return driver


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_page_written_straight_to_the_lower_tier_counts_as_demoted(name):
    # A (80 MB) is pinned in a 100 MB budget: B (50 MB) finds nothing to evict.
    batch = make_batch(sizes_mb=[80, 50], created=[0.0, 1.0], reads=[[], []],
                       capacity_mb=100)
    run = BatchRun(batch, _pin_page_0(driver_factory(name, CFG)(batch)))
    tr = run.run()
    b = run.slots[1]
    assert tr.demoted_bytes == b.demotion.stored_bytes > 0
    assert tr.overflow_events == 1 and b.where == LOWER and b.demotions == 1
    assert run.used == 80 * MB


def test_a_restore_that_finds_no_room_writes_nothing_again():
    # written straight to HOST at creation (200 MB); the read restores it but it stays
    # there (no room): nothing new crosses to the lower tier.
    batch = make_batch(sizes_mb=[200], created=[0.0], reads=[[1.0]], capacity_mb=100)
    tr = BatchRun(batch, driver_factory("lru", CFG)(batch)).run()
    assert tr.overflow_events == 2 and tr.demoted_bytes == 200 * MB
    assert tr.transfer_bytes == 200 * MB


def test_a_recomputed_page_with_no_room_counts_as_demoted():
    # B is retired on a false signal at 1.0; A (pinned, 150 MB) fills the 200 MB budget
    # by B's read at 3.0, so the re-prefilled B is written straight to HOST.
    batch = make_batch(sizes_mb=[100, 100], created=[2.0, 0.5], reads=[[], [3.0]],
                       capacity_mb=200, eol=[4.0, 4.0])
    batch = dataclasses.replace(batch, sizes=np.array([150 * MB, 100 * MB], np.int64),
                                false_signal_at=np.array([np.inf, 1.0]),
                                recompute_s=np.array([0.1, 0.25]))
    run = BatchRun(batch, _pin_page_0(driver_factory("lru", CFG, signals=ALL_SIGNALS)(batch)))
    tr = run.run()
    assert tr.false_signal_reads == 1 and tr.overflow_events == 1
    assert tr.demoted_bytes == 100 * MB
