"""SLO / risk control: reference copies, verification checkpoints, recompute entries.

High-correctness pages (verified results, pages feeding code / JSON output)
keep a full-precision reference copy in a lower tier whenever their working
copy is lossy; a lossy restore of such a page is followed by a verification
checkpoint; a page with no recoverable copy keeps a recompute entry. The risk
proxy of paper §3.2 (prediction error x correctness weight x demotion depth) is
a pressure indicator, not task accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS
from agentkv_cluster.policy.base import PageView, RiskDecision, StateType
from agentkv_cluster.policy.value import TYPE_ORDER, PageColumns
from store.types import Codec, Tier

_MAX_DEPTH = (len(Tier) - 1) + (len(Codec) - 1)


@dataclass(frozen=True, kw_only=True)
class RiskConfig:
    reference_threshold: float = 0.8  # correctness weight at/above which a reference is kept
    int8_threshold: float = 0.5  # at/above (without reference): lossy no further than INT8
    int4_threshold: float = 0.25  # at/above (without reference): no further than INT4
    low_confidence: float = 0.5  # below: high-value pages are not demoted early
    protect_weight: float = 0.5  # correctness weight counted as "high value" by the guard
    enabled: bool = True  # False = the "no risk control" ablation


class RiskController:
    """Pure per-page risk decisions."""

    def __init__(self, config: RiskConfig | None = None) -> None:
        self.config = config or RiskConfig()

    def decide(self, page: PageView) -> RiskDecision:
        cfg = self.config
        defaults = TYPE_DEFAULTS[page.state_type]
        if not cfg.enabled:
            return RiskDecision(
                page_id=page.page_id, keep_reference=False, checkpoint=False,
                recompute_entry=defaults.keep_recompute_entry,
                max_lossy_codec=Codec.LOW_RANK,
            )
        weight = page.correctness_weight
        keep_reference = (
            weight >= cfg.reference_threshold
            or page.produces_structured
            or page.state_type is StateType.VERIFIED_RESULT
            or defaults.keep_reference
        )
        if keep_reference:
            max_codec = Codec.INT4  # the reference absorbs the error
        elif weight >= cfg.int8_threshold:
            max_codec = Codec.INT8
        elif weight >= cfg.int4_threshold:
            max_codec = Codec.INT4
        else:
            max_codec = Codec.LOW_RANK
        return RiskDecision(
            page_id=page.page_id,
            keep_reference=keep_reference,
            checkpoint=keep_reference,
            # without a reference, a lossy copy is not recoverable exactly: keep tokens
            recompute_entry=defaults.keep_recompute_entry or not keep_reference,
            max_lossy_codec=max_codec,
        )

    def decide_columns(self, cols: PageColumns) -> tuple[np.ndarray, np.ndarray]:
        """``decide`` over columns: (keep_reference bool[n], max_lossy_codec int8[n])."""
        cfg = self.config
        n = len(cols.page_ids)
        if not cfg.enabled:
            return np.zeros(n, dtype=np.bool_), np.full(n, int(Codec.LOW_RANK), dtype=np.int8)
        type_ref = np.array([TYPE_DEFAULTS[t].keep_reference for t in TYPE_ORDER])
        verified = TYPE_ORDER.index(StateType.VERIFIED_RESULT)
        keep = (
            (cols.correctness >= cfg.reference_threshold) | cols.structured
            | (cols.type_idx == verified) | type_ref[cols.type_idx]
        )
        max_codec = np.select(
            [keep, cols.correctness >= cfg.int8_threshold, cols.correctness >= cfg.int4_threshold],
            [int(Codec.INT4), int(Codec.INT8), int(Codec.INT4)],
            default=int(Codec.LOW_RANK),
        ).astype(np.int8)
        return keep, max_codec

    def allowed(self, decision: RiskDecision, codec: Codec) -> bool:
        """May the working copy take ``codec``? RECOMPUTE needs a recompute entry."""
        if codec is Codec.RECOMPUTE:
            return decision.recompute_entry
        return codec <= decision.max_lossy_codec

    def needs_checkpoint(self, page: PageView, restored_from: Codec) -> bool:
        """Verify against the reference after restoring ``page`` from ``restored_from``?"""
        return restored_from.is_lossy and self.decide(page).checkpoint

    def needs_recompute(self, *, has_full_copy: bool, has_lossy_copy: bool,
                        verification_failed: bool = False) -> bool:
        """Re-prefill when no copy exists, or a lossy restore failed verification
        and there is no full copy to fall back to."""
        if has_full_copy:
            return False
        return verification_failed or not has_lossy_copy

    def guard_demotion(self, page: PageView) -> bool:
        """False when a low-confidence prediction must not demote a high-value page early."""
        cfg = self.config
        if not cfg.enabled:
            return True
        high_value = page.correctness_weight >= cfg.protect_weight or page.dependency > 0.0
        return not (high_value and page.confidence < cfg.low_confidence)

    @staticmethod
    def demotion_depth(tier: Tier, codec: Codec) -> float:
        """0 for HBM/FULL, 1 for the deepest tier in the most lossy form."""
        return (int(tier) + int(codec)) / _MAX_DEPTH

    def risk_proxy(self, page: PageView, *, tier: Tier, codec: Codec,
                   predicted_idle_s: float, actual_idle_s: float) -> float:
        """§3.2: |log prediction error| x correctness weight x demotion depth."""
        if predicted_idle_s <= 0 or actual_idle_s <= 0:
            raise ValueError("idle times must be > 0 for the log prediction error")
        error = abs(math.log(actual_idle_s / predicted_idle_s))
        return error * page.correctness_weight * self.demotion_depth(tier, codec)
