"""Workloads the event loop replays: the synthetic Table-3 generator and its record type.

A workload is a sequence of independent batches. Each batch is a set of pages
with a type, a size, a creation time, the times it is read again, what the
predictor believes about each idle gap, and when the orchestrator's
end-of-life signal (commit, failure confirmed, superseded) arrives. Everything
random is drawn up front with numpy from one seed, so every policy sees
exactly the same pages, gaps, noise and jitter (common random numbers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import MB, SimConfig

TYPE_ORDER: tuple[StateType, ...] = tuple(StateType)


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One independent working set. Arrays are indexed by page (0..n-1)."""

    index: int
    capacity_bytes: int  # HBM budget for this batch
    types: np.ndarray  # int8 index into TYPE_ORDER
    sizes: np.ndarray  # int64 full-precision bytes
    created: np.ndarray  # float64 seconds
    eol: np.ndarray  # float64: end-of-life signal time (inf = none)
    access_times: tuple[np.ndarray, ...]  # per page, sorted reuse times (may be empty)
    predicted_idle: tuple[np.ndarray, ...]  # per page, one prediction per idle gap
    jitter_ms: np.ndarray  # float64 per page: queueing jitter of its restores
    sessions: tuple[str, ...] = ()  # per page; empty = one session per batch
    tool_classes: tuple[str, ...] = ()  # per page; "" = unknown

    @property
    def n_pages(self) -> int:
        return int(self.sizes.shape[0])


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Batches plus where they came from (printed with the results)."""

    source: str
    batches: Sequence[Batch]

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _truncated_lognormal(
    rng: np.random.Generator, shape: tuple[int, ...], median: float, sigma: float,
    lo: float, hi: float,
) -> np.ndarray:
    """Log-normal draws restricted to [lo, hi] by redrawing the rejected ones."""
    out = np.exp(np.log(median) + sigma * rng.standard_normal(shape))
    bad = (out < lo) | (out > hi)
    while bad.any():
        out[bad] = np.exp(np.log(median) + sigma * rng.standard_normal(int(bad.sum())))
        bad = (out < lo) | (out > hi)
    return out


def synthetic_workload(cfg: SimConfig) -> Workload:
    """The Table-3 workload for ``cfg`` (vectorised over all batches)."""
    wl = cfg.workload
    shape = (wl.batches, wl.blocks_per_batch)
    rng = np.random.Generator(np.random.PCG64(cfg.seed))
    params = [wl.types[t] for t in TYPE_ORDER]
    mix = np.array([p.mix for p in params])
    types = rng.choice(len(TYPE_ORDER), size=shape, p=mix / mix.sum()).astype(np.int8)
    sizes_mb = _truncated_lognormal(
        rng, shape, wl.size_median_mb, wl.size_sigma, wl.size_min_mb, wl.size_max_mb)
    sizes = np.round(sizes_mb * MB).astype(np.int64)
    # Prefixes come first (system prompt); the rest is produced over the build window.
    created = rng.uniform(0.0, wl.build_window_s, size=shape)
    created[types == TYPE_ORDER.index(StateType.FIXED_PREFIX)] = 0.0
    # Up to ``max_reads`` idle gaps per page; after each use the page is read again
    # with its type's reuse probability, else its consumers are done.
    gshape = (*shape, wl.max_reads)
    median = np.array([p.idle_median_s for p in params])[types][..., None]
    sigma = np.array([p.idle_sigma for p in params])[types][..., None]
    idle = median * np.exp(sigma * rng.standard_normal(gshape))
    reuse_p = np.array([p.reuse_prob for p in params])[types][..., None]
    again = rng.random(gshape) < reuse_p
    n_reads = np.cumprod(again, axis=2).sum(axis=2)
    # The noise draw does not depend on sigma, so a noise sweep changes only its scale.
    predicted = idle * np.exp(cfg.noise * rng.standard_normal(gshape))
    eol_frac = rng.random(shape)
    jitter = rng.exponential(cfg.link.jitter_mean_ms, size=shape)
    reads = created[..., None] + np.cumsum(idle, axis=2)
    last_use = np.where(n_reads > 0,
                        np.take_along_axis(reads, np.maximum(n_reads - 1, 0)[..., None], 2)[..., 0],
                        created)
    # The end-of-life signal (commit, failure, superseded) lands inside the gap that
    # never ends in a read; a page that used all its reads is done at its last read.
    next_gap = np.take_along_axis(idle, np.minimum(n_reads, wl.max_reads - 1)[..., None], 2)[..., 0]
    eol = np.where(n_reads < wl.max_reads, last_use + eol_frac * next_gap, last_use)
    capacity = np.floor(cfg.budget * sizes.sum(axis=1)).astype(np.int64)
    batches = []
    for b in range(wl.batches):
        batches.append(Batch(
            index=b,
            capacity_bytes=int(capacity[b]),
            types=types[b],
            sizes=sizes[b],
            created=created[b],
            eol=eol[b],
            access_times=tuple(reads[b, i, :n_reads[b, i]] for i in range(shape[1])),
            predicted_idle=tuple(predicted[b, i] for i in range(shape[1])),
            jitter_ms=jitter[b],
        ))
    return Workload(source=f"synthetic(seed={cfg.seed})", batches=batches)
