"""The demo's pooled P95 ratio and its bootstrap interval over seeds (``pooled_ratio``)."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.api.compare import Reading, pooled_ratio


def _seeds(rng: np.random.Generator, scale: float, n: int = 10) -> list[list[float]]:
    return [list(rng.exponential(scale, 24)) for _ in range(n)]


def test_the_ratio_is_that_of_the_pooled_percentiles() -> None:
    ours, theirs = [[1.0, 2.0], [3.0, 4.0]], [[2.0, 4.0], [6.0, 8.0]]
    got = pooled_ratio(ours, theirs, q=50)
    assert got.ratio == pytest.approx(np.percentile([1, 2, 3, 4], 50)
                                      / np.percentile([2, 4, 6, 8], 50))
    assert got.low <= got.ratio <= got.high


def test_policies_drawn_alike_get_an_interval_holding_one() -> None:
    rng = np.random.default_rng(11)
    got = pooled_ratio(_seeds(rng, 100.0), _seeds(rng, 100.0))
    assert got.low < 1.0 < got.high
    assert got.reading() is Reading.UNCLEAR


def test_a_clearly_faster_policy_gets_an_interval_below_one() -> None:
    rng = np.random.default_rng(12)
    got = pooled_ratio(_seeds(rng, 40.0), _seeds(rng, 100.0))
    assert got.high < 1.0 and got.ratio < 0.6
    assert got.reading() is Reading.FASTER
    assert pooled_ratio(_seeds(rng, 100.0), _seeds(rng, 40.0)).reading() is Reading.SLOWER


def test_one_slow_seed_widens_the_interval() -> None:
    """Seeds are the resampled unit: a single seed that dominates the tail makes the
    interval wide, where resampling single accesses would call the ratio sharp."""
    rng = np.random.default_rng(13)
    ours, theirs = _seeds(rng, 100.0), _seeds(rng, 100.0)
    calm = pooled_ratio(ours, theirs)
    ours[3] = [x * 10 for x in ours[3]]
    stormy = pooled_ratio(ours, theirs)
    assert stormy.high - stormy.low > 2 * (calm.high - calm.low)


def test_the_interval_is_reproducible_and_seeds_must_match() -> None:
    rng = np.random.default_rng(14)
    ours, theirs = _seeds(rng, 50.0), _seeds(rng, 60.0)
    assert pooled_ratio(ours, theirs) == pooled_ratio(ours, theirs)
    with pytest.raises(ValueError, match="same"):
        pooled_ratio(ours, theirs[:-1])
    with pytest.raises(ValueError, match="same"):
        pooled_ratio([], [])
