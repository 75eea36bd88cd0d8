"""Risk controller: reference copies, checkpoints, recompute entries, risk proxy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentkv_cluster.policy.base import StateType
from agentkv_cluster.policy.risk import RiskConfig, RiskController
from agentkv_cluster.policy.value import PageColumns
from store.types import Codec, Tier
from tests.unit.policy.builders import page

T = StateType


@pytest.mark.parametrize(
    ("state_type", "weight", "structured", "keep_ref", "max_codec", "recompute_entry"),
    [
        (T.VERIFIED_RESULT, 1.0, False, True, Codec.INT4, True),
        (T.TEMP_REASONING, 0.3, True, True, Codec.INT4, True),  # feeds code / JSON
        (T.TEMP_REASONING, 0.85, False, True, Codec.INT4, True),  # weight over threshold
        (T.EVIDENCE, 0.5, False, True, Codec.INT4, False),  # Table 1: keep a reversible copy
        (T.TOOL_OBSERVATION, 0.6, False, False, Codec.INT8, True),
        (T.TOOL_OBSERVATION, 0.3, False, False, Codec.INT4, True),
        (T.FAILED_BRANCH, 0.05, False, False, Codec.LOW_RANK, True),
    ],
)
def test_decide_table(state_type, weight, structured, keep_ref, max_codec, recompute_entry):
    p = page(1, state_type=state_type, correctness_weight=weight, produces_structured=structured)
    d = RiskController().decide(p)
    assert (d.keep_reference, d.checkpoint, d.max_lossy_codec, d.recompute_entry) == (
        keep_ref, keep_ref, max_codec, recompute_entry)


def test_disabled_controller_keeps_no_reference():
    d = RiskController(RiskConfig(enabled=False)).decide(
        page(1, state_type=T.VERIFIED_RESULT, correctness_weight=1.0))
    assert (d.keep_reference, d.checkpoint, d.max_lossy_codec) == (False, False, Codec.LOW_RANK)


def test_columns_match_scalar_decisions():
    rng = np.random.default_rng(3)
    pages = [page(i, state_type=list(T)[i % 7], correctness_weight=float(rng.random()),
                  produces_structured=bool(i % 5 == 0)) for i in range(70)]
    risk = RiskController()
    keep, max_codec = risk.decide_columns(PageColumns.from_pages(pages))
    scalar = [risk.decide(p) for p in pages]
    assert keep.tolist() == [d.keep_reference for d in scalar]
    assert max_codec.tolist() == [int(d.max_lossy_codec) for d in scalar]


def test_checkpoint_only_after_lossy_restore_of_referenced_page():
    risk = RiskController()
    verified = page(1, state_type=T.VERIFIED_RESULT, correctness_weight=1.0)
    draft = page(2, state_type=T.TEMP_REASONING, correctness_weight=0.3)
    assert risk.needs_checkpoint(verified, Codec.INT4) is True
    assert risk.needs_checkpoint(verified, Codec.FULL) is False
    assert risk.needs_checkpoint(draft, Codec.INT4) is False


@pytest.mark.parametrize(
    ("full", "lossy", "failed", "expected"),
    [(True, True, True, False), (False, True, False, False), (False, True, True, True),
     (False, False, False, True)],
)
def test_recompute_when_no_usable_copy(full, lossy, failed, expected):
    assert RiskController().needs_recompute(
        has_full_copy=full, has_lossy_copy=lossy, verification_failed=failed) is expected


def test_allowed_respects_max_codec_and_recompute_entry():
    risk = RiskController()
    obs = risk.decide(page(1, state_type=T.TOOL_OBSERVATION, correctness_weight=0.6))
    assert [risk.allowed(obs, c) for c in Codec] == [True, True, False, False, True]
    evidence = risk.decide(page(2, state_type=T.EVIDENCE, correctness_weight=0.5))
    assert risk.allowed(evidence, Codec.RECOMPUTE) is False  # no recompute entry for evidence


def test_guard_blocks_low_confidence_demotion_of_high_value_pages():
    risk = RiskController()
    assert risk.guard_demotion(page(1, correctness_weight=0.9, confidence=0.2)) is False
    assert risk.guard_demotion(page(2, dependency=1.0, confidence=0.2)) is False
    assert risk.guard_demotion(page(3, correctness_weight=0.9, confidence=0.9)) is True
    assert risk.guard_demotion(page(4, correctness_weight=0.1, confidence=0.2)) is True
    off = RiskController(RiskConfig(enabled=False))
    assert off.guard_demotion(page(1, correctness_weight=0.9, confidence=0.2)) is True


def test_risk_proxy_is_error_times_weight_times_depth():
    risk = RiskController()
    p = page(1, correctness_weight=0.5)
    assert risk.demotion_depth(Tier.HBM, Codec.FULL) == 0.0
    assert risk.demotion_depth(Tier.NVME, Codec.RECOMPUTE) == 1.0
    assert risk.demotion_depth(Tier.HOST, Codec.INT4) == pytest.approx(3 / 6)
    value = risk.risk_proxy(p, tier=Tier.HOST, codec=Codec.INT4,
                            predicted_idle_s=2.0, actual_idle_s=2.0 * math.e)
    assert value == pytest.approx(1.0 * 0.5 * 0.5)
    assert risk.risk_proxy(p, tier=Tier.HBM, codec=Codec.FULL,
                           predicted_idle_s=1.0, actual_idle_s=9.0) == 0.0
    with pytest.raises(ValueError):
        risk.risk_proxy(p, tier=Tier.HOST, codec=Codec.INT4, predicted_idle_s=0.0,
                        actual_idle_s=1.0)
