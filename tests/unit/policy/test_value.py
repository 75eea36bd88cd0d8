"""Eq. 3 exactly, the coefficient profiles, and the vectorised path."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.policy.base import CostModel, PageView, StateType
from agentkv_cluster.policy.value import (
    PROFILES,
    PageColumns,
    UnknownProfile,
    ValueModel,
    ValueProfile,
    profile_for,
)
from store.types import Tier
from tests.unit.policy.builders import page

UNIT = ValueProfile(name="unit", alpha=1.0, beta=1.0, gamma=1.0, delta=1.0, eta=1.0, lam=1.0)
# host link 1 GB/s, 0.5 ms fixed: C_move = 2 * (0.5 ms + m / 1e9)
COST = CostModel(link_bytes_per_s={t: 1e9 for t in Tier},
                 fixed_overhead_s={Tier.HBM: 0.0, Tier.HOST: 0.5e-3, Tier.NVME: 1e-3})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # p*C_recomp + D + Q - C_move - GB*idle
        ({"size_bytes": 0}, 0.5 * 0.0 - 1e-3),
        ({"size_bytes": 10**9, "reuse_prob": 0.5, "recompute_cost_s": 2.0},
         1.0 - (1e-3 + 2.0)),
        ({"size_bytes": 10**8, "dependency": 3.0, "correctness_weight": 0.5,
          "predicted_idle_s": 4.0},
         3.0 + 0.5 - (1e-3 + 0.2) - 0.1 * 4.0),
    ],
)
def test_eq3_terms(fields, expected):
    p = PageView(page_id=1, state_type=StateType.EVIDENCE, **fields)
    assert ValueModel(UNIT, COST).value(p) == pytest.approx(expected)


def test_dependency_ablation_drops_only_the_dependency_term():
    p = page(1, size_mb=10, dependency=5.0, reuse_prob=0.9, recompute_cost_s=1.0)
    with_dep = ValueModel(UNIT, COST).value(p)
    without = ValueModel(UNIT, COST, use_dependency=False).value(p)
    assert with_dep - without == pytest.approx(5.0)


def test_code_repair_values_correctness_and_recompute_more_than_open_retrieval():
    code, retrieval = PROFILES["code-repair"], PROFILES["open-retrieval"]
    assert code.gamma > retrieval.gamma
    assert code.alpha > retrieval.alpha
    assert code.lam > retrieval.lam  # open retrieval tolerates aggressive compression
    verified = page(1, size_mb=50, state_type=StateType.VERIFIED_RESULT, correctness_weight=1.0,
                    reuse_prob=0.8, recompute_cost_s=0.5)
    assert ValueModel(code).value(verified) > ValueModel(retrieval).value(verified)


def test_profile_for_scales_with_slo_and_rejects_unknown():
    base = profile_for("code-repair")
    tight = profile_for("code-repair", ttft_slo_s=0.25)
    assert tight.alpha == pytest.approx(base.alpha * 4.0)
    assert profile_for("code-repair", ttft_slo_s=100.0).alpha == pytest.approx(base.alpha * 0.5)
    with pytest.raises(UnknownProfile):
        profile_for("chit-chat")
    with pytest.raises(ValueError):
        profile_for("code-repair", ttft_slo_s=0.0)


def test_vectorised_values_equal_scalar_values():
    rng = np.random.default_rng(7)
    pages = [page(i, size_mb=float(rng.uniform(1, 200)), reuse_prob=float(rng.random()),
                  recompute_cost_s=float(rng.random()), dependency=float(rng.integers(0, 4)),
                  correctness_weight=float(rng.random()), predicted_idle_s=float(rng.random() * 9))
             for i in range(50)]
    for model in (ValueModel(PROFILES["code-repair"]), ValueModel(use_dependency=False)):
        cols = PageColumns.from_pages(pages)
        assert np.allclose(model.values(cols), [model.value(p) for p in pages])
        assert np.allclose(model.densities(cols), [model.density(p) for p in pages])
