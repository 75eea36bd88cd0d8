"""A pool that dies takes its copies; the HBM actors that demoted into it demote into the
live pool fewest HBM actors use from then on (pure page manager, no Ray)."""

from __future__ import annotations

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.strategies import make_strategy
from tests.unit.service.test_controller import MB


def _paired() -> Controller:
    ctl = Controller(make_strategy("lru"))
    for hbm, pool in (("h0", "p0"), ("h1", "p1"), ("h2", "p0"), ("h3", "p2")):
        ctl.add_hbm(hbm, 2 * MB, pool)
    return ctl


def test_hbm_actors_of_a_dead_pool_are_spread_over_the_live_pools() -> None:
    ctl = _paired()
    ctl.remove_pool("p0", ["p1", "p2"])
    assert ctl.table.hbm_pool == {"h0": "p1", "h1": "p1", "h2": "p2", "h3": "p2"}


def test_without_a_live_pool_the_pairing_stays_as_it_was() -> None:
    ctl = _paired()
    ctl.remove_pool("p0")
    assert ctl.table.hbm_pool == {"h0": "p0", "h1": "p1", "h2": "p0", "h3": "p2"}

