"""Bytes the cluster keeps in its lower tiers, per pool, and their capacity prices.

Phase 2 of the paper's placement (eq. 4-5) picks an evicted page's tier and form by
least cost with every tier byte priced at the tier's capacity price; the ledger gives
that choice its two inputs for the page's pool: the free bytes of each lower tier (an
option that does not fit is never chosen) and the prices at which the pages the pool
already keeps would fit its capacity (``AgentKvPolicy.tier_prices``), refreshed every
``REPRICE_EVERY`` demotions into the pool. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agentkv_cluster.policy.base import PageView
from store.types import Tier

LOWER = (Tier.HOST, Tier.NVME)
REPRICE_EVERY = 16  # demotions into a pool between two price computations


@dataclass(frozen=True, kw_only=True)
class TierRoom:
    """What one demotion may use: free bytes per lower tier and their prices (per byte)."""

    free: Mapping[Tier, int]
    mu: tuple[float, float] = (0.0, 0.0)  # (HOST, NVME)


class TierLedger:
    def __init__(self, capacity: Mapping[Tier, int] | None = None) -> None:
        """``capacity``: bytes of each lower tier in every pool (None: unbounded)."""
        self.capacity = dict(capacity) if capacity else {}
        self.used: dict[str, Counter[Tier]] = {}
        self.members: dict[str, set[int]] = {}  # pool -> gids with bytes there
        self._prices: dict[str, tuple[float, float]] = {}
        self._since: Counter[str] = Counter()

    def add(self, pool: str, gid: int, tier: Tier, nbytes: int) -> None:
        self.used.setdefault(pool, Counter())[tier] += nbytes
        self.members.setdefault(pool, set()).add(gid)
        self._since[pool] += 1

    def release(self, pool: str, gid: int, stored: Mapping[Tier, int]) -> None:
        """A page's copies in ``pool`` are gone (retired, erased)."""
        used = self.used.get(pool)
        if used is not None:
            for tier, n in stored.items():
                used[tier] = max(0, used[tier] - n)
        self.members.get(pool, set()).discard(gid)

    def forget_pool(self, pool: str) -> None:
        for table in (self.used, self.members, self._prices):
            table.pop(pool, None)

    def room(self, pool: str, views: Callable[[Iterable[int]], list[PageView]],
             prices: Callable[[list[PageView], Mapping[Tier, int]], tuple[float, float]]
             ) -> TierRoom | None:
        """The room a demotion into ``pool`` has (None: tiers unbounded). ``views`` maps
        gids to the policy's page views; ``prices`` computes eq. 5's capacity prices."""
        if not self.capacity:
            return None
        used = self.used.get(pool, Counter())
        free = {t: max(0, self.capacity.get(t, 0) - used[t]) for t in LOWER}
        if pool not in self._prices or self._since[pool] >= REPRICE_EVERY:
            self._prices[pool] = prices(views(self.members.get(pool, ())), self.capacity)
            self._since[pool] = 0
        return TierRoom(free=free, mu=self._prices[pool])
