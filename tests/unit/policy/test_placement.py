"""Two-phase placement (eq. 4-5): capacities, HBM by density, options, incremental replan."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.policy.base import (
    DuplicatePage,
    InfeasiblePlan,
    InvalidPageView,
    StateType,
    UnknownPage,
)
from agentkv_cluster.policy.placement import NotPlaced, PlacementConfig, PlacementPlanner
from agentkv_cluster.policy.risk import RiskConfig, RiskController
from agentkv_cluster.policy.value import PROFILES, ValueModel
from store.types import Codec, Tier
from tests.unit.policy.builders import MB, page

TYPES = list(StateType)


def random_pages(rng: np.random.Generator, n: int, sessions: int = 10):
    sizes = rng.integers(1, 64, n)
    return [page(i, size_mb=int(sizes[i]), state_type=TYPES[int(rng.integers(7))],
                 session=f"s{i % sessions}", reuse_prob=float(rng.random()),
                 recompute_cost_s=float(rng.random()), correctness_weight=float(rng.random()),
                 dependency=float(rng.integers(0, 3)), predicted_idle_s=float(rng.exponential(3)),
                 pinned=bool(rng.random() < 0.02), produces_structured=bool(rng.random() < 0.1))
            for i in range(n)]


def assert_within(used, caps):
    for tier in Tier:
        assert used[tier] <= caps[tier], (tier, used, caps)


def plan_bytes(plan):
    """Recount the bytes of a plan from its columns (not from its own used_bytes)."""
    stored = np.asarray(plan.stored_bytes)
    used = {t: int(stored[np.asarray(plan.tiers) == int(t)].sum()) for t in Tier}
    refs = np.asarray(plan.reference_tiers) >= 0
    return used, refs


@pytest.mark.parametrize("seed", range(40))
def test_capacity_never_exceeded_on_random_instances(seed):
    rng = np.random.default_rng(seed)
    pages = random_pages(rng, int(rng.integers(20, 400)))
    total = sum(p.size_bytes for p in pages)
    pinned = sum(p.size_bytes for p in pages if p.pinned)
    caps = {Tier.HBM: pinned + int(total * rng.uniform(0.0, 0.5)),
            Tier.HOST: int(total * rng.uniform(0.0, 0.5)),
            Tier.NVME: int(total * rng.uniform(0.0, 0.6))}
    planner = PlacementPlanner(ValueModel())
    plan = planner.plan(pages, caps, now=0.0)
    used, refs = plan_bytes(plan)
    ref_bytes = sum(p.size_bytes for p, r in zip(pages, refs) if r)
    used[Tier.NVME] += ref_bytes
    assert used == plan.used_bytes
    assert_within(used, caps)
    tiers = np.asarray(plan.tiers)
    assert all(tiers[i] == Tier.HBM for i, p in enumerate(pages) if p.pinned)
    # incremental replans of random sessions keep every capacity too
    for step in range(5):
        session = f"s{int(rng.integers(10))}"
        touched = [p.page_id for p in pages if p.session == session]
        for pid in touched:
            pages[pid].reuse_prob = float(rng.random())
            pages[pid].predicted_idle_s = float(rng.exponential(5))
            pages[pid].pinned = False
        planner.replan(touched, now=float(step))
        assert_within(planner.used_bytes(), caps)
        recount = {t: 0 for t in Tier}
        for p in pages:
            placed = planner.placement(p.page_id)
            recount[placed.tier] += placed.stored_bytes
            recount[Tier.NVME] += placed.reference_bytes
        assert recount == planner.used_bytes()


def test_hbm_takes_the_densest_pages_and_packs_smaller_ones_after_a_misfit():
    # RECOMPUTE-only lower tiers isolate phase 1
    pages = [page(1, size_mb=4, reuse_prob=1.0, recompute_cost_s=4.0),  # dense
             page(2, size_mb=8, reuse_prob=1.0, recompute_cost_s=6.0),  # less dense, too big
             page(3, size_mb=2, reuse_prob=1.0, recompute_cost_s=1.0),
             page(4, size_mb=1, reuse_prob=0.0)]  # least dense
    plan = PlacementPlanner(ValueModel()).plan(
        pages, {Tier.HBM: 7 * MB, Tier.HOST: 0, Tier.NVME: 0}, now=0.0)
    assert np.asarray(plan.tiers).tolist() == [Tier.HBM, Tier.NVME, Tier.HBM, Tier.HBM]
    assert np.asarray(plan.codecs).tolist() == [Codec.FULL, Codec.RECOMPUTE, Codec.FULL,
                                                Codec.FULL]
    assert plan.used_bytes == {Tier.HBM: 7 * MB, Tier.HOST: 0, Tier.NVME: 0}


@pytest.mark.parametrize(
    ("profile", "weight", "expected"),
    [
        # balanced prices risk low: the smallest copy (low-rank) restores fastest
        ("balanced", 0.2, Codec.LOW_RANK),
        # code repair prices risk 10x higher: INT8 (error 0.01) beats INT4 / low-rank
        ("code-repair", 0.2, Codec.INT8),
        # correctness 0.6 caps the working copy at INT8 whatever the profile
        ("open-retrieval", 0.6, Codec.INT8),
    ],
)
def test_options_follow_the_lagrangian_cost(profile, weight, expected):
    planner = PlacementPlanner(ValueModel(PROFILES[profile]))
    pages = [page(1, size_mb=100, state_type=StateType.TEMP_REASONING, reuse_prob=0.9,
                  correctness_weight=weight, recompute_cost_s=2.0),
             page(2, size_mb=100, state_type=StateType.FAILED_BRANCH, reuse_prob=0.01,
                  correctness_weight=0.0, recompute_cost_s=0.001)]
    plan = planner.plan(pages, {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 10**12}, now=0.0)
    assert (planner.placement(1).tier, planner.placement(1).codec) == (Tier.HOST, expected)
    # the dead branch: keeping its bytes costs more than its expected recompute
    assert planner.placement(2).codec is Codec.RECOMPUTE
    assert plan.objective > 0


def test_tight_host_capacity_prices_pages_down_to_compressed_forms():
    pages = [page(i, size_mb=100, state_type=StateType.TOOL_OBSERVATION, reuse_prob=0.9,
                  correctness_weight=0.3, recompute_cost_s=2.0) for i in range(10)]
    loose = PlacementPlanner(ValueModel(PROFILES["code-repair"]))
    loose.plan(pages, {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 0}, now=0.0)
    assert {loose.placement(i).codec for i in range(10)} == {Codec.INT8}
    tight = PlacementPlanner(ValueModel(PROFILES["code-repair"]))
    plan = tight.plan(pages, {Tier.HBM: 0, Tier.HOST: 400 * MB, Tier.NVME: 0}, now=0.0)
    assert plan.used_bytes[Tier.HOST] <= 400 * MB
    codecs = [tight.placement(i).codec for i in range(10)]
    assert Codec.INT4 in codecs  # the host price mu pushed pages to the smaller form


def test_referenced_pages_pay_for_a_full_copy_on_nvme():
    planner = PlacementPlanner(ValueModel())
    verified = page(1, size_mb=100, state_type=StateType.VERIFIED_RESULT,
                    correctness_weight=1.0, reuse_prob=0.9, recompute_cost_s=2.0)
    planner.plan([verified], {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 10**12}, now=0.0)
    placed = planner.placement(1)
    assert placed.codec.is_lossy
    assert (placed.reference_tier, placed.reference_bytes) == (Tier.NVME, 100 * MB)
    # without NVMe room for the reference, the working copy must itself be full precision
    planner.plan([verified], {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 0}, now=0.0)
    assert (planner.placement(1).tier, planner.placement(1).codec) == (Tier.HOST, Codec.FULL)


def test_allowed_codecs_restrict_options():
    only_full = PlacementPlanner(ValueModel(), config=PlacementConfig(allowed_codecs=(Codec.FULL,)))
    p = page(1, size_mb=100, state_type=StateType.TEMP_REASONING, reuse_prob=0.9,
             recompute_cost_s=2.0, correctness_weight=0.1)
    plan = only_full.plan([p], {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 10**12}, now=0.0)
    assert int(np.asarray(plan.codecs)[0]) == Codec.FULL


def test_pinned_overflow_raises_and_changes_nothing():
    planner = PlacementPlanner(ValueModel())
    pages = [page(1, size_mb=4, pinned=True), page(2, size_mb=4)]
    caps = {Tier.HBM: 5 * MB, Tier.HOST: 10 * MB, Tier.NVME: 0}
    planner.plan(pages, caps, now=0.0)
    before = (planner.placement(1), planner.placement(2), planner.used_bytes())
    pages[1].pinned = True
    with pytest.raises(InfeasiblePlan):
        planner.replan([2], now=1.0)
    assert (planner.placement(1), planner.placement(2), planner.used_bytes()) == before
    with pytest.raises(InfeasiblePlan):
        PlacementPlanner(ValueModel()).plan(pages, caps, now=0.0)
    with pytest.raises(UnknownPage):
        planner.replan([99], now=1.0)


def test_replan_is_local():
    rng = np.random.default_rng(5)
    pages = random_pages(rng, 3000, sessions=100)
    for p in pages:
        p.pinned = False
    total = sum(p.size_bytes for p in pages)
    caps = {Tier.HBM: total // 3, Tier.HOST: total // 3, Tier.NVME: total}
    planner = PlacementPlanner(ValueModel())
    planner.plan(pages, caps, now=0.0)
    before = {p.page_id: planner.placement(p.page_id) for p in pages}
    touched = [p.page_id for p in pages if p.session == "s7"]  # one tool-start event
    for pid in touched:
        pages[pid].predicted_idle_s *= 10
    delta = planner.replan(touched, now=1.0)
    assert delta.planned_at == 1.0
    after = {p.page_id: planner.placement(p.page_id) for p in pages}
    moved = {pid for pid in before if before[pid] != after[pid]}
    assert moved == {c.page_id for c in delta.changes}  # the delta reports every change
    assert len(touched) <= delta.considered <= 3 * len(touched)  # not a full replan
    assert_within(planner.used_bytes(), caps)


def test_lowered_value_hands_hbm_to_the_densest_page_outside():
    pages = [page(i, size_mb=10, reuse_prob=0.5, recompute_cost_s=0.1 * (4 - i))
             for i in range(4)]
    caps = {Tier.HBM: 20 * MB, Tier.HOST: 100 * MB, Tier.NVME: 0}
    planner = PlacementPlanner(ValueModel())
    planner.plan(pages, caps, now=0.0)
    assert [planner.placement(i).tier for i in range(4)] == [Tier.HBM, Tier.HBM,
                                                             Tier.HOST, Tier.HOST]
    pages[0].recompute_cost_s = 0.0
    delta = planner.replan([0], now=1.0)
    assert {c.page_id for c in delta.changes} == {0, 2}
    # free to recompute now: the recompute entry is its cheapest form
    assert [planner.placement(i).tier for i in range(4)] == [Tier.NVME, Tier.HBM,
                                                             Tier.HBM, Tier.HOST]
    assert planner.placement(0).codec is Codec.RECOMPUTE
    assert delta.used_bytes[Tier.HBM] == 20 * MB


def test_raised_value_pulls_a_page_into_hbm_by_displacing_lower_density():
    pages = [page(i, size_mb=10, reuse_prob=0.5, recompute_cost_s=0.1) for i in range(4)]
    caps = {Tier.HBM: 20 * MB, Tier.HOST: 100 * MB, Tier.NVME: 0}
    planner = PlacementPlanner(ValueModel())
    planner.plan(pages, caps, now=0.0)
    outside = [p.page_id for p in pages if planner.placement(p.page_id).tier is not Tier.HBM]
    assert outside == [2, 3]  # equal density: lower ids first
    pages[3].recompute_cost_s = 5.0
    delta = planner.replan([3], now=1.0)
    assert planner.placement(3).tier is Tier.HBM
    assert {c.page_id for c in delta.changes} == {3, 1}  # 1 was the least dense resident
    assert planner.placement(1).tier is Tier.HOST
    assert planner.used_bytes()[Tier.HBM] == 20 * MB


def test_add_and_forget_pages():
    planner = PlacementPlanner(ValueModel())
    planner.plan([page(1, size_mb=1)], {Tier.HBM: 2 * MB, Tier.HOST: 0, Tier.NVME: 0}, now=0.0)
    planner.add(page(2, size_mb=1))
    with pytest.raises(NotPlaced):
        planner.placement(2)
    with pytest.raises(DuplicatePage):
        planner.add(page(2, size_mb=1))
    planner.replan([2], now=1.0)
    assert planner.placement(2).tier is Tier.HBM
    assert planner.used_bytes()[Tier.HBM] == 2 * MB
    planner.forget(1)
    assert planner.used_bytes()[Tier.HBM] == MB
    with pytest.raises(UnknownPage):
        planner.placement(1)


def test_risk_disabled_allows_lossy_without_reference():
    planner = PlacementPlanner(ValueModel(), RiskController(RiskConfig(enabled=False)))
    verified = page(1, size_mb=100, state_type=StateType.VERIFIED_RESULT,
                    correctness_weight=1.0, reuse_prob=0.9, recompute_cost_s=2.0)
    planner.plan([verified], {Tier.HBM: 0, Tier.HOST: 10**12, Tier.NVME: 10**12}, now=0.0)
    assert planner.placement(1).reference_bytes == 0
    assert planner.placement(1).codec.is_lossy


@pytest.mark.parametrize(
    "bad", [{"reuse_prob": 1.5}, {"confidence": -0.1}, {"predicted_idle_s": -1.0},
            {"tokens": -1}, {"branch_confidence": 2.0}])
def test_invalid_pages_are_rejected_and_the_plan_is_kept(bad):
    planner = PlacementPlanner(ValueModel())
    caps = {Tier.HBM: 2 * MB, Tier.HOST: 0, Tier.NVME: 0}
    planner.plan([page(1), page(2)], caps, now=0.0)
    with pytest.raises(InvalidPageView):
        planner.plan([page(1), page(3, **bad)], caps, now=1.0)
    assert planner.placement(2).tier is Tier.HBM  # the previous plan still stands
    with pytest.raises(DuplicatePage):
        planner.plan([page(1), page(1)], caps, now=1.0)


def test_bad_capacities_are_rejected():
    planner = PlacementPlanner(ValueModel())
    with pytest.raises(ValueError):
        planner.plan([page(1)], {Tier.HBM: -1}, now=0.0)
    with pytest.raises(TypeError):
        planner.plan([page(1)], {"hbm": 10}, now=0.0)


@pytest.mark.parametrize("mu", [(0.0, 0.0), (1e-10, 0.0), (2e-11, 5e-11)])
def test_one_page_path_matches_the_vectorised_costs(mu):
    rng = np.random.default_rng(11)
    costs = PlacementPlanner(ValueModel(PROFILES["code-repair"])).costs
    pages = random_pages(rng, 200)
    risk = RiskController()
    unlimited = {Tier.HOST: 1 << 62, Tier.NVME: 1 << 62}
    for p in pages:
        d = risk.decide(p)
        rows = costs.rows(np.array([p.size_bytes]), np.array([p.reuse_prob]),
                          np.array([p.recompute_cost_s]), np.array([p.correctness_weight]),
                          np.array([d.keep_reference]), np.array([int(d.max_lossy_codec)]))
        k = int(rows._choose(mu)[0])
        single = costs.best_single(size=p.size_bytes, reuse=p.reuse_prob,
                                   recompute_s=p.recompute_cost_s,
                                   correctness=p.correctness_weight, keep_ref=d.keep_reference,
                                   max_codec=d.max_lossy_codec, mu=mu, free=unlimited)
        assert single == (k, int(rows.stored[0, k]), int(rows.ref[0, k]))
