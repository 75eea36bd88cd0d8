"""AgentKvPolicy: value-density victims, risk protection, conservative fallback, ablations."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy, allowed_codecs
from agentkv_cluster.policy.base import Mechanisms, StateType, ToolStart
from store.types import Codec, Tier
from tests.unit.policy.builders import MB, page


def test_victims_are_lowest_value_density_first_and_protected_pages_last():
    policy = AgentKvPolicy()
    policy.on_insert(page(1, size_mb=10, reuse_prob=0.9, recompute_cost_s=2.0), now=0.0)
    policy.on_insert(page(2, size_mb=10, reuse_prob=0.1, recompute_cost_s=0.1), now=0.0)
    policy.on_insert(page(3, size_mb=10, reuse_prob=0.5, recompute_cost_s=1.0), now=0.0)
    # worthless but high-correctness under a shaky prediction: the risk guard keeps it
    policy.on_insert(page(4, size_mb=10, correctness_weight=0.9, confidence=0.4), now=0.0)
    assert policy.conservative() is False  # mean confidence 0.85
    assert policy.select_victims(40 * MB, now=1.0) == [2, 3, 1, 4]


def test_conservative_fallback_uses_lru_order_and_full_precision():
    policy = AgentKvPolicy()
    for pid, last in ((1, 3.0), (2, 1.0), (3, 2.0)):
        policy.on_insert(page(pid, last_access=last, confidence=0.2, reuse_prob=0.9,
                              recompute_cost_s=float(pid)), now=last)
    assert policy.conservative() is True
    assert policy.demotion(page(9, size_mb=100, reuse_prob=0.9, recompute_cost_s=2.0,
                                state_type=StateType.TEMP_REASONING)).codec is Codec.FULL
    assert policy.select_victims(3 * MB, now=4.0) == [2, 3, 1]


def test_demotion_picks_a_compressed_host_copy_and_respects_free_space():
    policy = AgentKvPolicy()
    draft = page(1, size_mb=100, state_type=StateType.TEMP_REASONING, reuse_prob=0.9,
                 recompute_cost_s=2.0, correctness_weight=0.2)
    placed = policy.demotion(draft)
    assert (placed.tier, placed.codec, placed.stored_bytes) == (Tier.HOST, Codec.LOW_RANK,
                                                                25 * MB)
    full_host = policy.demotion(draft, free={Tier.HOST: 0})
    assert full_host.tier is Tier.NVME
    verified = page(2, size_mb=100, state_type=StateType.VERIFIED_RESULT, reuse_prob=0.9,
                    recompute_cost_s=2.0, correctness_weight=1.0)
    kept = policy.demotion(verified)
    assert (kept.codec, kept.reference_tier, kept.reference_bytes) == (Codec.INT4, Tier.NVME,
                                                                       100 * MB)


@pytest.mark.parametrize(
    ("mechanisms", "expected"),
    [
        (Mechanisms(), (Codec.FULL, Codec.INT8, Codec.INT4, Codec.LOW_RANK)),
        (Mechanisms(reversible_compression=False), (Codec.FULL,)),
        (Mechanisms(adaptive_precision=False), (Codec.INT8,)),
    ],
)
def test_ablation_codecs(mechanisms, expected):
    assert allowed_codecs(AgentKvConfig(mechanisms=mechanisms)) == expected


def test_ablations_reach_the_modules():
    draft = page(1, size_mb=100, state_type=StateType.TEMP_REASONING, reuse_prob=0.9,
                 recompute_cost_s=2.0, correctness_weight=0.2, dependency=3.0, session="s")
    no_comp = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(reversible_compression=False)))
    assert no_comp.demotion(draft).codec is Codec.FULL
    fixed = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(adaptive_precision=False)))
    assert fixed.demotion(draft).codec is Codec.INT8
    no_dep = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(event_dependency=False)))
    full = AgentKvPolicy()
    assert full.value_model.value(draft) - no_dep.value_model.value(draft) == pytest.approx(
        full.config.profile.beta * 3.0)
    no_risk = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(risk_control=False)))
    verified = page(2, size_mb=100, state_type=StateType.VERIFIED_RESULT, reuse_prob=0.9,
                    recompute_cost_s=2.0, correctness_weight=1.0)
    assert no_risk.demotion(verified).reference_bytes == 0
    start = ToolStart(session="s", call_id="c", tool_class="grep", started_at=0.0)
    no_gap = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(gap_prefetch=False)))
    light = page(3, size_mb=1, reuse_prob=0.9, session="s", dependency=0.5)
    assert no_gap.on_tool_start(start, [light], now=0.0).prefetches == ()
    assert len(full.on_tool_start(start, [light], now=0.0).prefetches) == 1


def test_tool_return_feeds_the_duration_law():
    policy = AgentKvPolicy()
    start = ToolStart(session="s", call_id="c", tool_class="grep", started_at=10.0)
    pages = [page(1, size_mb=1, reuse_prob=0.9, session="s", position=0, tokens=16,
                  dependency=0.5)]
    plan = policy.on_tool_start(start, pages, now=10.0)
    report = policy.on_tool_return(plan, pages, now=10.5)
    assert policy.predictor.tools.distribution("grep").n == 1
    assert report.cancelled_prefetches == (1,)  # returned long before the predicted 2 s
    assert report.resident_prefix == ()


# ---------------------------------------------------------------- event graph signal
def _retirement_policy(**mech: bool) -> AgentKvPolicy:
    policy = AgentKvPolicy(AgentKvConfig(mechanisms=Mechanisms(**mech)))
    policy.on_insert(page(1, size_mb=10, dependency=0.5), now=0.0)
    policy.on_insert(page(2, size_mb=20, dependency=0.5), now=0.0)
    return policy


def test_consumers_done_retires_a_tracked_page_from_every_tier():
    policy = _retirement_policy()
    done = page(1, size_mb=10, dependency=0.0)
    decision = policy.on_consumers_done(done, now=1.0)
    assert (decision.page_id, decision.retire) == (1, True)
    assert 1 not in policy and policy.resident_bytes() == 20 * MB
    # a page held only in a lower tier (untracked) is retired as well
    assert policy.on_consumers_done(page(7, dependency=0.0), now=1.0).retire is True


def test_consumers_done_keeps_the_page_when_the_graph_blocks_or_the_mechanism_is_off():
    blocked = _retirement_policy()
    decision = blocked.on_consumers_done(page(1, size_mb=10), now=1.0, retirable=False)
    assert decision.retire is False and "blocks" in decision.reason
    assert 1 in blocked and blocked.resident_bytes() == 30 * MB
    ablated = _retirement_policy(event_dependency=False)
    decision = ablated.on_consumers_done(page(1, size_mb=10), now=1.0)
    assert decision.retire is False and 1 in ablated


def test_paper_faithful_lru_keeps_the_page_the_fair_one_frees_it():
    from agentkv_cluster.policy.base import ALL_SIGNALS
    from agentkv_cluster.policy.baselines import LruPolicy

    lru = LruPolicy()  # the paper's baseline: blind to the event graph
    lru.on_insert(page(1, size_mb=4, dependency=0.5), now=0.0)
    assert lru.on_consumers_done(page(1, size_mb=4), now=1.0).retire is False
    assert lru.resident_bytes() == 4 * MB
    fair = LruPolicy(signals=ALL_SIGNALS)
    fair.on_insert(page(1, size_mb=4, dependency=0.5), now=0.0)
    assert fair.on_consumers_done(page(1, size_mb=4), now=1.0).retire is True
    assert fair.resident_bytes() == 0


# ---------------------------------------------------------------- prefetch admission
def _ranked_policy() -> AgentKvPolicy:
    policy = AgentKvPolicy()
    policy.on_insert(page(1, size_mb=10, reuse_prob=0.1, recompute_cost_s=0.1), now=0.0)
    policy.on_insert(page(2, size_mb=10, reuse_prob=0.9, recompute_cost_s=5.0), now=0.0)
    return policy


def test_a_prefetch_displaces_only_pages_ranked_below_it():
    policy = _ranked_policy()
    mid = page(3, size_mb=10, reuse_prob=0.5, recompute_cost_s=1.0)
    admission = policy.admit_prefetch(mid, need_bytes=10 * MB, now=1.0)
    assert (admission.admitted, admission.victims) == (True, (1,))
    assert 3 in policy and 1 not in policy and policy.resident_bytes() == 20 * MB


def test_a_prefetch_that_would_displace_a_denser_page_is_refused_and_changes_nothing():
    policy = _ranked_policy()
    mid = page(3, size_mb=10, reuse_prob=0.5, recompute_cost_s=1.0)
    admission = policy.admit_prefetch(mid, need_bytes=15 * MB, now=1.0)  # needs 1 and 2
    assert (admission.admitted, admission.victims) == (False, ())
    assert 1 in policy and 2 in policy and 3 not in policy
    assert policy.resident_bytes() == 20 * MB
    room = policy.admit_prefetch(mid, need_bytes=0, now=1.0)
    assert (room.admitted, room.victims) == (True, ()) and policy.resident_bytes() == 30 * MB


# ---------------------------------------------------------------- victim order
def test_columnar_victim_order_equals_the_per_page_order_on_large_resident_sets():
    import numpy as np

    rng = np.random.default_rng(3)
    policy = AgentKvPolicy()
    views = []
    for pid in range(600):
        views.append(page(pid, size_mb=float(rng.uniform(8, 220)),
                          reuse_prob=float(rng.uniform()), recompute_cost_s=float(rng.uniform(0, 2)),
                          correctness_weight=float(rng.uniform()), dependency=float(rng.uniform()),
                          confidence=float(rng.uniform(0.3, 1.0)),
                          predicted_idle_s=float(rng.exponential(3)),
                          last_access=float(rng.uniform(0, 5))))
        policy.on_insert(views[-1], now=0.0)
    assert not policy.conservative()
    per_page = [p.page_id for p in sorted(views, key=lambda p: policy.rank_key(p, 6.0))]
    assert policy._victim_order(6.0) == per_page


def test_occupancy_counts_the_idle_time_ahead_and_then_the_time_overdue():
    policy = AgentKvPolicy()
    waiting = page(1, size_mb=100, last_access=10.0, predicted_idle_s=8.0)
    model = policy.value_model
    assert model.terms(waiting)["occupy"] == pytest.approx(100 * MB / 1e9 * 8.0)
    assert model.terms(waiting, now=15.0)["occupy"] == pytest.approx(100 * MB / 1e9 * 3.0)
    assert model.terms(waiting, now=18.0)["occupy"] == 0.0  # due now
    # overdue by 12 s: heavy-tailed gaps, expected to wait about as long again
    assert model.terms(waiting, now=30.0)["occupy"] == pytest.approx(100 * MB / 1e9 * 12.0)
    # the longer a page is overdue, the lower its value: it goes before a page just due
    due = page(2, size_mb=100, last_access=22.0, predicted_idle_s=8.0)
    assert model.value(waiting, now=30.0) < model.value(due, now=30.0)


def test_a_verified_reference_absorbs_the_quality_risk_of_int4():
    # Low reuse, high correctness: with a FULL reference the INT4 working copy is
    # preferred; without risk control (no reference) the same page stays at INT8
    # or better because its quality risk is priced.
    evidence = page(1, size_mb=50, state_type=StateType.EVIDENCE, reuse_prob=0.3,
                    recompute_cost_s=0.1, correctness_weight=0.6)
    kept = AgentKvPolicy().demotion(evidence)
    assert (kept.codec, kept.reference_tier) == (Codec.INT4, Tier.NVME)
    mid = page(2, size_mb=50, state_type=StateType.TOOL_OBSERVATION, reuse_prob=0.3,
               recompute_cost_s=0.1, correctness_weight=0.5)
    assert AgentKvPolicy().demotion(mid).codec is Codec.INT8  # risk clamp, no reference
