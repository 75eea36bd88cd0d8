"""Tool-gap migration and prefetch, eq. (6): H_i = min(1, T_gap / T_move).

On a tool start the session is not evicted wholesale. Pages are ranked by
remaining predicted idle time and future dependency (idle / (1 + D)). A short gap moves
only small, low-value pages that the gap fully hides. Otherwise migration is
progressive: a wave starts at each quantile of the tool's duration law and a
page joins the first wave whose *remaining* predicted gap hides its T_move with
a slack that grows with its value, so large or valuable pages move only once
the tool is in its long tail. Prefetch of a moved page starts at
predicted return - T_move and carries a link-credit reservation; pages nobody
will read (no unfinished consumer) are not prefetched, nor pages for which the
prefetch does not pay: with a trained ``returns.ReturnModel``, P(read again |
silent until the prefetch would start) x the restore it hides must beat the link
time it wastes otherwise (before it has learned anything: reuse below the floor). An early
return cancels unfinished prefetches and not-yet-started migrations and
reports the largest prefix (by token position) still resident in HBM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentkv_cluster.policy.base import (
    CostModel,
    EarlyReturnReport,
    GapPlan,
    Migration,
    PageId,
    PageView,
    Prefetch,
    ToolStart,
    remaining_idle_s,
)
from agentkv_cluster.policy.predictor import LogNormal, Predictor
from agentkv_cluster.policy.returns import ReturnModel
from agentkv_cluster.policy.risk import RiskController
from agentkv_cluster.policy.value import ValueModel
from store.types import Codec, Tier


@dataclass(frozen=True, kw_only=True)
class GapConfig:
    short_gap_s: float = 1.0  # predicted remaining gap below this is "short"
    small_page_bytes: int = 32 << 20  # short gaps move only pages up to this size ...
    low_value_fraction: float = 0.5  # ... in the lower half of the session by value density
    wave_quantiles: tuple[float, ...] = (0.0, 0.5, 0.75, 0.9, 0.97)  # of the tool duration
    wave_fractions: tuple[float, ...] = (0.5, 0.75, 0.9, 1.0, 1.0)  # share of the move order
    return_quantile: float = 0.5  # predicted return = this quantile of the remaining gap
    value_slack: float = 2.0  # the densest page needs a gap of (1 + value_slack) x T_move
    prefetch_min_reuse: float = 0.3  # pages less likely to be reused are not prefetched
    codec: Codec = Codec.INT4  # working-copy codec, clamped by the risk decision
    to_tier: Tier = Tier.HOST
    prefetch: bool = True  # False = the "no gap prefetch" ablation

    def __post_init__(self) -> None:
        if len(self.wave_quantiles) != len(self.wave_fractions) or not self.wave_quantiles:
            raise ValueError("wave_quantiles and wave_fractions must be non-empty, same length")
        if list(self.wave_quantiles) != sorted(self.wave_quantiles):
            raise ValueError("wave_quantiles must be ascending")
        if not 0.0 < self.return_quantile < 1.0:
            raise ValueError(f"return_quantile must be in (0, 1), got {self.return_quantile}")


class GapPlanner:
    """Pure tool-gap planner; callers execute the plan and call ``early_return``."""

    def __init__(self, cost: CostModel, predictor: Predictor, value_model: ValueModel,
                 risk: RiskController | None = None, config: GapConfig | None = None,
                 returns: ReturnModel | None = None) -> None:
        self.cost = cost
        self.predictor = predictor
        self.value_model = value_model
        self.risk = risk or RiskController()
        self.config = config or GapConfig()
        self.returns = returns

    def plan(self, tool_start: ToolStart, pages: Sequence[PageView], now: float) -> GapPlan:
        cfg = self.config
        law = self.predictor.tools.distribution(tool_start.tool_class)
        gap = law.remaining_quantile(cfg.return_quantile, max(0.0, now - tool_start.started_at))
        predicted_return = now + gap
        movable = [p for p in pages if p.session == tool_start.session
                   and p.tier is Tier.HBM and not p.pinned and self.risk.guard_demotion(p)]
        density = {p.page_id: self.value_model.density(p, now) for p in movable}
        by_value = sorted(density, key=lambda k: (density[k], k))
        value_rank = {pid: r / max(len(by_value), 1) for r, pid in enumerate(by_value)}
        if gap < cfg.short_gap_s:
            waves = [_Wave(now, 1.0, remaining=gap)]
            movable = [p for p in movable if p.size_bytes <= cfg.small_page_bytes
                       and value_rank[p.page_id] < cfg.low_value_fraction]
        else:
            waves = self._waves(law, tool_start.started_at, now)
        # move order: long predicted idle and weak future dependency first, low value on ties
        movable.sort(key=lambda p: (-remaining_idle_s(p, now) / (1.0 + p.dependency),
                                    value_rank[p.page_id], p.page_id))
        migrations = []
        for r, page in enumerate(movable):
            m = self._migration(page, r / len(movable), value_rank[page.page_id], waves)
            if m is not None:
                migrations.append(m)
        migrations.sort(key=lambda m: (m.start_at, m.page_id))
        return GapPlan(tool_start=tool_start, predicted_return=predicted_return,
                       migrations=tuple(migrations),
                       prefetches=self._prefetches(migrations, pages))

    def early_return(self, plan: GapPlan, pages: Sequence[PageView], now: float) -> EarlyReturnReport:
        """The tool returned at ``now``: cancel what is unfinished, report the resident prefix."""
        by_id = {p.page_id: p for p in pages}
        started = {m.page_id for m in plan.migrations if m.start_at <= now}
        cancelled_migrations = tuple(m.page_id for m in plan.migrations if m.start_at > now)
        done, cancelled = set(), []
        for f in plan.prefetches:
            size = by_id[f.page_id].size_bytes
            if f.start_at + self.cost.restore_time(size, f.from_tier, f.codec) <= now:
                done.add(f.page_id)
            else:
                cancelled.append(f.page_id)
        prefix: list[PageId] = []
        end = 0
        for page in sorted((p for p in pages if p.session == plan.tool_start.session),
                           key=lambda p: (p.position, p.page_id)):
            moved_out = page.page_id in started or page.tier is not Tier.HBM
            if moved_out and page.page_id not in done:
                break
            prefix.append(page.page_id)
            end = page.position + page.tokens
        return EarlyReturnReport(returned_at=now, cancelled_prefetches=tuple(cancelled),
                                 cancelled_migrations=cancelled_migrations,
                                 resident_prefix=tuple(prefix), resident_prefix_tokens=end)

    # ------------------------------------------------------------ helpers
    def _waves(self, law: LogNormal, started_at: float, now: float) -> list[_Wave]:
        """Start and share of the move order admitted per wave; each wave's predicted
        remaining gap is computed only if a page gets that far."""
        cfg = self.config
        out: list[_Wave] = []
        for q, fraction in zip(cfg.wave_quantiles, cfg.wave_fractions, strict=True):
            start = max(now, started_at + (law.quantile(q) if q > 0 else 0.0))
            if out and start <= out[-1].start:
                out[-1].fraction = fraction  # already due: widen this wave
            else:
                out.append(_Wave(start, fraction, law=law, elapsed=start - started_at,
                                 quantile=cfg.return_quantile))
        return out

    def _migration(self, page: PageView, order: float, value_rank: float,
                   waves: list[_Wave]) -> Migration | None:
        """The first wave that admits the page's move order and hides its T_move with a
        slack that grows with its value rank."""
        codec = self._codec(page)
        t_move = self.cost.move_time(page.size_bytes, self.config.to_tier, codec)
        slack = 1.0 + self.config.value_slack * value_rank
        for wave in waves:
            if order < wave.fraction and wave.remaining >= slack * t_move:
                remaining = wave.remaining
                return Migration(
                    page_id=page.page_id, start_at=wave.start, to_tier=self.config.to_tier,
                    codec=codec, moved_bytes=self.cost.stored_bytes(page.size_bytes, codec),
                    t_move_s=t_move, hideable=min(1.0, remaining / t_move) if t_move else 1.0,
                    expected_return=wave.start + remaining)
        return None

    def worth_prefetching(self, page: PageView, at: float | None = None, *,
                          restore_s: float | None = None, displaced_bytes: int = 0) -> bool:
        """Likely enough to be read again, and (when the value model tracks event
        dependency) some reachable consumer still unfinished: a page whose consumers
        are all done is read by no one, however high its reuse prior.

        With a trained return model and a start time ``at``, "likely enough" is the
        cost-aware rule instead of the reuse floor: P(read again | silent until
        ``at``) x the restore it hides must beat the link time (and displaced bytes)
        it wastes otherwise (``returns.ReturnModel.worth_prefetching``)."""
        if not (page.dependency > 0.0 or not self.value_model.use_dependency):
            return False
        if at is None or self.returns is None or not self.returns.trained:
            return page.reuse_prob >= self.config.prefetch_min_reuse
        if restore_s is None:
            restore_s = self.cost.restore_time(page.size_bytes, self.config.to_tier,
                                               self._codec(page))
        return self.returns.worth_prefetching(page, at, restore_s, displaced_bytes)

    def _codec(self, page: PageView) -> Codec:
        limit = self.risk.decide(page).max_lossy_codec
        return min(self.config.codec, limit)

    def _prefetches(self, migrations: list[Migration],
                    pages: Sequence[PageView]) -> tuple[Prefetch, ...]:
        """Prefetches of one wave share the link: scheduled back to back in prefix
        (position) order so the last lands at that wave's expected return and each
        starts no later than expected return - its own T_move; an early return then
        finds the longest possible prefix resident."""
        if not self.config.prefetch:
            return ()
        by_id = {p.page_id: p for p in pages}
        waves: dict[float, list[Migration]] = {}
        for m in migrations:
            page = by_id[m.page_id]
            at = max(m.start_at, m.expected_return - m.t_move_s)
            if self.worth_prefetching(page, at, restore_s=self.cost.restore_time(
                    page.size_bytes, m.to_tier, m.codec)):
                waves.setdefault(m.expected_return, []).append(m)
        out = []
        for expected_return, group in waves.items():
            group.sort(key=lambda m: (by_id[m.page_id].position, m.page_id))
            start = expected_return - sum(m.t_move_s for m in group)
            for m in group:
                begin = max(start, m.start_at + m.t_move_s / 2.0)  # after evict + compress
                out.append(Prefetch(page_id=m.page_id, start_at=begin, from_tier=m.to_tier,
                                    codec=m.codec, moved_bytes=m.moved_bytes,
                                    link_credit_bytes=m.moved_bytes))
                start = begin + m.t_move_s
        out.sort(key=lambda f: (f.start_at, f.page_id))
        return tuple(out)


class _Wave:
    """One migration wave; its remaining predicted gap is computed on first use."""

    __slots__ = ("_elapsed", "_law", "_quantile", "_remaining", "fraction", "start")

    def __init__(self, start: float, fraction: float, *, remaining: float | None = None,
                 law: LogNormal | None = None, elapsed: float = 0.0,
                 quantile: float = 0.5) -> None:
        self.start, self.fraction = start, fraction
        self._remaining, self._law = remaining, law
        self._elapsed, self._quantile = elapsed, quantile

    @property
    def remaining(self) -> float:
        if self._remaining is None:
            assert self._law is not None
            self._remaining = self._law.remaining_quantile(self._quantile, self._elapsed)
        return self._remaining
