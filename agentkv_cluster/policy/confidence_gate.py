"""AgentKV's conservative-fallback test, kept up to date instead of re-summed per call.

The fallback holds when the mean prediction confidence of the unpinned resident
pages is below the threshold, computed as ``sum(conf) / len(conf) < threshold``
over the pages in tracking order. That float sum depends on the order of the
additions, so it cannot be updated page by page to the same bits. The gate
keeps the exact sum instead (every double is an integer multiple of 2**-1074)
and decides from it only when the float expression provably lands on the same
side of the threshold: recursive summation of n non-negative terms (Python's
``sum`` before 3.12; the compensated sum of 3.12 on is closer still) is off the
exact sum by at most (n-1)u/(1-(n-1)u) of it, and the division by n adds one
rounding of u (u = 2**-53); the gate allows 2(n+2)u of the exact mean. Within
that margin (or with a value that is not a finite number) it answers None and
the policy sums as before.
"""

from __future__ import annotations

import math

from agentkv_cluster.policy.base import PageId

_SCALE_BITS = 1074  # 2**-1074: the smallest double; every double is a multiple of it
_U_DEN = 1 << 53  # unit roundoff u = 1 / _U_DEN


def _scaled(value: float) -> int | None:
    """``value`` x 2**1074 as an exact integer, None when not a finite number >= 0
    (the error bound holds for non-negative terms)."""
    if not math.isfinite(value) or value < 0:
        return None
    num, den = value.as_integer_ratio()
    return num << (_SCALE_BITS - (den.bit_length() - 1))


class ConfidenceGate:
    """Exact total and count of the confidences of the counted (unpinned) pages."""

    def __init__(self) -> None:
        self._terms: dict[PageId, int] = {}
        self._total = 0
        self._odd = 0  # counted pages whose confidence is not a finite number >= 0

    def clear(self) -> None:
        self._terms.clear()
        self._total = 0
        self._odd = 0

    def put(self, page_id: PageId, confidence: float, counted: bool) -> None:
        """Set the page's confidence; ``counted`` False (a pinned page) leaves it out."""
        self.drop(page_id)
        if not counted:
            return
        term = _scaled(confidence)
        if term is None:
            self._odd += 1
            term = -1
        else:
            self._total += term
        self._terms[page_id] = term

    def set_all(self, confidence: float) -> None:
        """Every counted page's confidence is now ``confidence``."""
        term, n = _scaled(confidence), len(self._terms)
        self._terms = dict.fromkeys(self._terms, -1 if term is None else term)
        self._odd, self._total = (n, 0) if term is None else (0, term * n)

    def drop(self, page_id: PageId) -> None:
        term = self._terms.pop(page_id, None)
        if term is None:
            return
        if term < 0:
            self._odd -= 1
        else:
            self._total -= term

    def below(self, threshold: float) -> bool | None:
        """``sum(conf) / len(conf) < threshold`` (False with no counted page), or
        None when the exact sum cannot tell which side the float result falls on."""
        n = len(self._terms)
        if n == 0:
            return False
        if self._odd or not math.isfinite(threshold) or n >= 1 << 40:
            return None
        t_num, t_den = threshold.as_integer_ratio()
        # margin >= S * (g(1 + u) + u), g = (n-1)u/(1-(n-1)u): 2(n + 2) u S, rounded up
        margin = (self._total * 2 * (n + 2)) // _U_DEN + 1
        target = t_num * n << _SCALE_BITS  # threshold x n x 2**1074, times t_den
        if (self._total + margin) * t_den < target:
            return True
        if (self._total - margin) * t_den >= target:
            return False
        return None
