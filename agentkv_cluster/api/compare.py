"""Two policies' restore delays compared: a pooled percentile ratio and its bootstrap interval.

Used by ``agentkv demo`` (units: the sessions of a round, paired across policies) and by
``benchmarks/bench_demo_seeds.py`` (units: whole seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Reading(Enum):
    """What a ratio's interval shows about the first policy; the value is how it reads."""

    FASTER = "faster"
    SLOWER = "slower"
    UNCLEAR = "cannot tell the two apart"


@dataclass(frozen=True, kw_only=True)
class RatioInterval:
    """One policy's pooled percentile delay over another's, with a bootstrap interval."""

    ratio: float
    low: float
    high: float
    level: float

    def reading(self) -> Reading:
        """What the interval shows: the first policy faster, slower, or neither."""
        if self.low <= 1.0 <= self.high:
            return Reading.UNCLEAR
        return Reading.FASTER if self.high < 1.0 else Reading.SLOWER


def pooled_ratio(ours: Sequence[Sequence[float]], theirs: Sequence[Sequence[float]], *,
                 q: float = 95.0, level: float = 0.9, resamples: int = 2000, seed: int = 0
                 ) -> RatioInterval:
    """The ``q``-th percentile of every delay in ``ours`` over that of ``theirs`` (one list
    of delays per seed, the same seeds in the same order), with a ``level`` percentile
    bootstrap interval that resamples whole seeds, both policies' delays together: the
    accesses of one seed share its workload and its stretch of machine load, so they are
    not independent samples (``RatioInterval.reading`` says what the interval shows)."""
    if not ours or len(ours) != len(theirs):
        raise ValueError("need the same, non-empty list of seeds for both policies")
    a = [np.asarray(d, dtype=float) for d in ours]
    b = [np.asarray(d, dtype=float) for d in theirs]

    def ratio(idx: Sequence[int]) -> float:
        mine = np.concatenate([a[i] for i in idx] + [np.zeros(0)])
        other = np.concatenate([b[i] for i in idx] + [np.zeros(0)])
        top = float(np.percentile(mine, q)) if mine.size else 0.0
        bottom = float(np.percentile(other, q)) if other.size else 0.0
        return top / bottom if bottom > 0 else (1.0 if top == 0 else float("inf"))

    rng = np.random.default_rng(seed)
    n = len(a)
    draws = [ratio(rng.integers(0, n, n)) for _ in range(resamples)]
    low, high = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    return RatioInterval(ratio=ratio(range(n)), low=float(low), high=float(high), level=level)
