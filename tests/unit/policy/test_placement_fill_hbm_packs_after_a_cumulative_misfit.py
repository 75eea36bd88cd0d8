"""Phase 1 of the two-phase placement (paper §2.3): HBM takes pages by value density
V/m while they fit; a page that fits on its own but not after the denser ones must not
stop smaller, less dense pages from filling the rest ("a few passes pack smaller ones")."""

from __future__ import annotations

import numpy as np

from agentkv_cluster.policy.placement import PlacementPlanner
from agentkv_cluster.policy.value import ValueModel
from store.types import Codec, Tier
from tests.unit.policy.builders import MB, page


def test_a_smaller_page_fills_the_space_left_after_a_cumulative_misfit():
    # eq. 3 with idle 0: V ~ alpha*p*C_recomp minus a tiny move cost (~0.4 ms per MB), so
    # density V/m ~ 1.0 (A), 0.75 (B), 0.5 (C) s/MB: order A > B > C.
    pages = [page(1, size_mb=4, reuse_prob=1.0, recompute_cost_s=4.0),  # A
             page(2, size_mb=4, reuse_prob=1.0, recompute_cost_s=3.0),  # B
             page(3, size_mb=2, reuse_prob=1.0, recompute_cost_s=1.0)]  # C
    vm = ValueModel()
    d = [vm.density(p) for p in pages]
    assert d[0] > d[1] > d[2] > 0
    # HBM 7 MB: A (4) fits; B (4) fits alone but not after A (8 > 7); C (2) then fits (6)
    plan = PlacementPlanner(vm).plan(
        pages, {Tier.HBM: 7 * MB, Tier.HOST: 0, Tier.NVME: 0}, now=0.0)
    assert np.asarray(plan.tiers).tolist() == [Tier.HBM, Tier.NVME, Tier.HBM]
    assert np.asarray(plan.codecs).tolist() == [Codec.FULL, Codec.RECOMPUTE, Codec.FULL]
    assert plan.used_bytes[Tier.HBM] == 6 * MB


def test_replan_fills_hbm_left_free_by_a_touched_page_that_no_longer_fits():
    # densities (s/MB, idle 0): X 12/6 = 2.0, T 7.5/4 = 1.875 (later 7.5/5 = 1.5), O 3/3 = 1.0
    x = page(1, size_mb=6, reuse_prob=1.0, recompute_cost_s=12.0)
    t = page(2, size_mb=4, reuse_prob=1.0, recompute_cost_s=7.5)
    o = page(3, size_mb=3, reuse_prob=1.0, recompute_cost_s=3.0)
    caps = {Tier.HBM: 10 * MB, Tier.HOST: 0, Tier.NVME: 0}
    planner = PlacementPlanner(ValueModel())
    plan = planner.plan([x, t, o], caps, now=0.0)
    assert np.asarray(plan.tiers).tolist() == [Tier.HBM, Tier.HBM, Tier.NVME]  # 6 + 4 = 10
    # T grows to 5 MB: it no longer fits beside X (6 + 5 > 10) and cannot displace the
    # denser X; it goes to the recompute entry, and the 4 MB it frees must take O (3 MB),
    # the densest page outside that fits -- what a full plan of the new state gives too.
    t.size_bytes = 5 * MB
    planner.replan([t.page_id], now=0.0)
    assert planner.placement(x.page_id).tier is Tier.HBM
    assert planner.placement(o.page_id).tier is Tier.HBM
    assert planner.placement(t.page_id).codec is Codec.RECOMPUTE
    assert planner.used_bytes()[Tier.HBM] == 9 * MB
    fresh = PlacementPlanner(ValueModel()).plan([x, t, o], caps, now=0.0)
    assert np.asarray(fresh.tiers).tolist() == [Tier.HBM, Tier.NVME, Tier.HBM]
