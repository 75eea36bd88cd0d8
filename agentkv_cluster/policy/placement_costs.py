"""Phase-2 option costs of eq. (4) for the placement planner, vectorised.

For each page and each lower-tier option (tier, codec), the cost is
``p_reuse * L(k, q) + E(k, q) + lam * R(q)`` with L the restore latency, E the
bytes written over the link (working copy, plus the FULL reference copy a lossy
form needs under the risk decision) and the bytes through the codec, each at
its own price, and R the quality risk ``Q * codec_error``. A lossy working copy
backed by a verified FULL reference carries no quality risk (the checkpoint
falls back to the reference), so high-correctness pages pay for their
reference in E instead. The recompute-only option costs ``p_reuse * C_recomp``,
stores nothing and is always allowed (the fallback that keeps every plan feasible).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.policy.base import CostModel
from store.types import Codec, Tier

OPTIONS: tuple[tuple[Tier, Codec], ...] = (
    *((Tier.HOST, c) for c in (Codec.FULL, Codec.INT8, Codec.INT4, Codec.LOW_RANK)),
    *((Tier.NVME, c) for c in (Codec.FULL, Codec.INT8, Codec.INT4, Codec.LOW_RANK)),
    (Tier.NVME, Codec.RECOMPUTE),  # no bytes; reported on the lowest tier
)
RECOMPUTE_OPTION = len(OPTIONS) - 1
_LOWER = (Tier.HOST, Tier.NVME)


class OptionCosts:
    """Per-option constants of one cost model and lambda."""

    def __init__(self, cost: CostModel, lam: float, allowed_codecs: tuple[Codec, ...]) -> None:
        self.lam = lam
        self.energy = cost.energy_per_byte
        self.codec_energy = cost.codec_energy_per_byte
        self.codec_bps = cost.codec_bytes_per_s
        self.codec_fixed = cost.codec_fixed_s
        self.tiers = np.array([int(t) for t, _ in OPTIONS], dtype=np.int8)
        self.codecs = np.array([int(c) for _, c in OPTIONS], dtype=np.int8)
        self.ratio = np.array([cost.codec_ratio[c] for _, c in OPTIONS])
        self.fixed = np.array([cost.fixed_overhead_s[t] for t, _ in OPTIONS])
        self.bw = np.array([cost.link_bytes_per_s[t] for t, _ in OPTIONS])
        self.err = np.array([cost.codec_error[c] for _, c in OPTIONS])
        self.lossy = np.array([c.is_lossy for _, c in OPTIONS])
        allowed = set(allowed_codecs) | {Codec.RECOMPUTE}
        self.allowed = np.array([c in allowed for _, c in OPTIONS])
        # plain-float copies for the one-page path (replan, demotion): no numpy overhead
        self._scalar = [
            (k, tier, codec, float(self.ratio[k]), float(self.fixed[k]), float(self.bw[k]),
             float(self.err[k]), codec.is_lossy)
            for k, (tier, codec) in enumerate(OPTIONS) if self.allowed[k]
        ]

    def best_single(self, *, size: int, reuse: float, recompute_s: float, correctness: float,
                    keep_ref: bool, max_codec: Codec, mu: tuple[float, float],
                    free: Mapping[Tier, int], recompute: bool = True) -> tuple[int, int, int]:
        """(option, stored bytes, reference bytes) of least priced cost for one page
        among the options that fit ``free``; the recompute entry always fits. Without
        ``recompute`` (nobody can re-prefill the page) it is taken only when no stored
        form fits."""
        best = (reuse * recompute_s if recompute else math.inf, RECOMPUTE_OPTION, 0, 0)
        for k, tier, codec, ratio, fixed, bw, err, lossy in self._scalar:
            if codec is Codec.RECOMPUTE or codec > max_codec:
                continue
            stored = round(size * ratio)
            ref = size if keep_ref and lossy else 0
            host = stored if tier is Tier.HOST else 0
            nvme = (stored if tier is Tier.NVME else 0) + ref
            if host > free[Tier.HOST] or nvme > free[Tier.NVME]:
                continue
            codec_s = size / self.codec_bps + self.codec_fixed if lossy else 0.0
            risk = 0.0 if ref else self.lam * correctness * err
            cost = (reuse * (fixed + stored / bw + codec_s) + self.energy * (stored + ref)
                    + (self.codec_energy * size if lossy else 0.0) + risk
                    + mu[0] * host + mu[1] * nvme)
            if cost < best[0]:
                best = (cost, k, stored, ref)
        return best[1], best[2], best[3]

    def rows(self, size, reuse, recompute_s, correctness, keep_ref, max_codec) -> OptionRows:
        size = np.asarray(size, dtype=np.float64)[:, None]
        stored = np.rint(size * self.ratio).astype(np.int64)
        latency = self.fixed + stored / self.bw + self.lossy * (size / self.codec_bps
                                                               + self.codec_fixed)
        latency[:, RECOMPUTE_OPTION] = recompute_s
        ref = np.where(np.asarray(keep_ref)[:, None] & self.lossy, size, 0).astype(np.int64)
        risk = np.where(ref > 0, 0.0, self.lam * np.asarray(correctness)[:, None] * self.err)
        cost = (np.asarray(reuse)[:, None] * latency + self.energy * (stored + ref)
                + self.codec_energy * self.lossy * size + risk)
        ok = self.allowed & (self.codecs <= np.asarray(max_codec)[:, None])
        ok[:, RECOMPUTE_OPTION] = True
        cost[~ok] = np.inf
        host = np.where(self.tiers == int(Tier.HOST), stored, 0)
        nvme = np.where(self.tiers == int(Tier.NVME), stored, 0) + ref
        return OptionRows(cost=cost, stored=stored, ref=ref, fp_host=host, fp_nvme=nvme,
                          option_tiers=self.tiers, option_codecs=self.codecs)


@dataclass(slots=True)
class OptionRows:
    cost: np.ndarray  # [n, K], inf where not allowed
    stored: np.ndarray  # [n, K] bytes in the option's tier
    ref: np.ndarray  # [n, K] FULL reference bytes on NVMe
    fp_host: np.ndarray  # [n, K] bytes charged to HOST
    fp_nvme: np.ndarray  # [n, K] bytes charged to NVME (working copy + reference)
    option_tiers: np.ndarray
    option_codecs: np.ndarray

    def footprint(self, tier: Tier) -> np.ndarray:
        return self.fp_host if tier is Tier.HOST else self.fp_nvme

    def subset(self, rows: np.ndarray) -> OptionRows:
        return OptionRows(cost=self.cost[rows], stored=self.stored[rows], ref=self.ref[rows],
                          fp_host=self.fp_host[rows], fp_nvme=self.fp_nvme[rows],
                          option_tiers=self.option_tiers, option_codecs=self.option_codecs)

    def cost_of(self, choice: np.ndarray) -> np.ndarray:
        return self.cost[np.arange(len(choice)), choice]

    def _choose(self, mu: tuple[float, float], rows: np.ndarray | slice = slice(None),
                cost: np.ndarray | None = None) -> np.ndarray:
        c = self.cost if cost is None else cost
        priced = (c[rows] + mu[0] * self.footprint(Tier.HOST)[rows]
                  + mu[1] * self.footprint(Tier.NVME)[rows])
        return np.argmin(priced, axis=1)

    def prices(self, capacity: Mapping[Tier, int], sample: int, iters: int) -> tuple[float, float]:
        """Tier prices mu (cost per byte) so that demand fits, estimated on a stride sample."""
        n = len(self.cost)
        if n == 0:
            return (0.0, 0.0)
        sub = self.subset(np.arange(0, n, max(1, n // sample)))
        scale = len(sub.cost) / n
        mu = [0.0, 0.0]
        for _ in range(2):  # coordinate passes: HOST, NVME, HOST, NVME
            for t, tier in enumerate(_LOWER):
                mu[t] = sub._price(tier, t, mu, capacity[tier] * scale, iters)
        return (mu[0], mu[1])

    def _price(self, tier: Tier, t: int, mu: list[float], cap: float, iters: int) -> float:
        fp = self.footprint(tier)
        rows = np.arange(len(fp))

        def demand(m: float) -> float:
            trial = list(mu)
            trial[t] = m
            return float(fp[rows, self._choose((trial[0], trial[1]))].sum())

        if demand(mu[t]) <= cap:
            return mu[t]
        lo, hi = -16.0, -2.0  # log10 of cost seconds per byte
        for _ in range(iters):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if demand(10**mid) <= cap else (mid, hi)
        return 10**hi

    def feasible_choice(self, mu: tuple[float, float], capacity: Mapping[Tier, int]) -> np.ndarray:
        """Price-guided choice, then repair: rows (in priority order) past a tier's
        capacity lose every option using that tier and choose again."""
        cost = self.cost.copy()
        choice = self._choose(mu, cost=cost)
        idx = np.arange(len(choice))
        while True:
            over = False
            for tier in _LOWER:
                fp = self.footprint(tier)
                use = fp[idx, choice]
                bad = (use > 0) & (np.cumsum(use) > capacity[tier])
                if bad.any():
                    over = True
                    rows = np.flatnonzero(bad)
                    sub = cost[rows]
                    sub[fp[rows] > 0] = np.inf
                    cost[rows] = sub
                    choice[rows] = self._choose(mu, rows, cost=cost)
            if not over:
                return choice
