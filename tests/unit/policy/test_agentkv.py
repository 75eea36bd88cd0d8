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
    light = page(3, size_mb=1, reuse_prob=0.9, session="s")
    assert no_gap.on_tool_start(start, [light], now=0.0).prefetches == ()
    assert len(full.on_tool_start(start, [light], now=0.0).prefetches) == 1


def test_tool_return_feeds_the_duration_law():
    policy = AgentKvPolicy()
    start = ToolStart(session="s", call_id="c", tool_class="grep", started_at=10.0)
    pages = [page(1, size_mb=1, reuse_prob=0.9, session="s", position=0, tokens=16)]
    plan = policy.on_tool_start(start, pages, now=10.0)
    report = policy.on_tool_return(plan, pages, now=10.5)
    assert policy.predictor.tools.distribution("grep").n == 1
    assert report.cancelled_prefetches == (1,)  # returned long before the predicted 2 s
    assert report.resident_prefix == ()
