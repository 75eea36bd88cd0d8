"""Workloads the event loop replays: the synthetic Table-3 generator and its record type.

A workload is a sequence of independent batches. Each batch is a set of pages
with a type, a size, a creation time, the times it is read again, what the
predictor believes about each idle gap, and when the page's end of life really
happens and of which kind (task end, branch abandoned, version superseded).
Per-page fields of varying length are any sequence of arrays: the synthetic
presets use tuples, a replayed trace ``Ragged`` (one array and offsets).
Everything random is drawn up front with numpy from one seed, so every policy
sees exactly the same pages, gaps, noise and jitter (common random numbers).

Fields fall into two groups. *Ground truth* (``access_times``, ``eol``,
``recompute_s``, ``correctness``) drives the event loop and the metrics only;
no policy ever sees it. *Observables* (sizes, types, times as they happen,
``predicted_idle``, ``recompute_est_s``: the cost model's estimate with its own
error) are what the drivers copy into a ``PageView``. The prediction errors are
drawn from a stream keyed by (seed, noise level): each noise level gets fresh
errors, while the pages, gaps and jitter stay the same (common random numbers,
so a sweep point differs from the next only in the quality of the predictions).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.base import EndOfLife
from agentkv_cluster.sim.config import MB, SimConfig

TYPE_ORDER: tuple[StateType, ...] = tuple(StateType)
SIGNAL_ORDER: tuple[EndOfLife, ...] = tuple(EndOfLife)  # index of Batch.eol_kind
# Which signal ends a page of each type in the synthetic workloads.
TYPE_SIGNAL: dict[StateType, EndOfLife] = {
    StateType.FAILED_BRANCH: EndOfLife.BRANCH_ABANDONED,
    StateType.TEMP_REASONING: EndOfLife.BRANCH_ABANDONED,
    StateType.TOOL_OBSERVATION: EndOfLife.VERSION_SUPERSEDED,
    StateType.EVIDENCE: EndOfLife.VERSION_SUPERSEDED,
}
_KIND_OF_TYPE = np.array([SIGNAL_ORDER.index(TYPE_SIGNAL.get(t, EndOfLife.TASK_END))
                          for t in TYPE_ORDER], dtype=np.int8)
NOISE_STREAM = 0x6E6F6973  # key of the prediction-error stream ("nois")


def noise_rng(seed: int, noise: float, batch: int = 0) -> np.random.Generator:
    """The prediction-error stream of one noise level (fresh errors per level)."""
    return np.random.Generator(np.random.PCG64([seed, NOISE_STREAM, round(noise * 1e6), batch]))


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """Where each of ``counts`` consecutive runs starts in one flat array, and the end
    (``Ragged``'s offsets: ``len(counts) + 1`` of them, the first 0)."""
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(counts, dtype=np.int64)])


class Ragged(Sequence[np.ndarray]):
    """Per-page arrays of different lengths held as one array and offsets: page ``i``'s
    is ``values[offsets[i]:offsets[i + 1]]`` (a view). A replayed trace has millions of
    pages; one small array each cost about 100 bytes of header per page and field."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values, self.offsets = values, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


class RaggedLabels(Sequence[tuple[str, ...]]):
    """Per-page tuples of labels (``Ragged`` of codes into ``names``)."""

    def __init__(self, codes: Ragged, names: Sequence[str]) -> None:
        self.codes, self.names = codes, tuple(names)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return tuple(self.names[k] for k in self.codes[i].tolist())

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return (self[i] for i in range(len(self)))

    def at(self, i: int, k: int) -> str:
        """``self[i][k]``, or "" past its end, without building page ``i``'s whole tuple
        (a long-lived page of a replayed trace has hundreds of gaps)."""
        codes = self.codes[i]
        return self.names[int(codes[k])] if k < len(codes) else ""


def label_at(labels: Sequence[tuple[str, ...]], i: int, k: int) -> str:
    """Page ``i``'s ``k``-th label, or "" when it has none (no labels at all, or past the
    page's own): ``RaggedLabels.at`` for a replayed trace's columns."""
    if isinstance(labels, RaggedLabels):
        return labels.at(i, k)
    row = labels[i] if labels else ()
    return row[k] if k < len(row) else ""


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One independent working set. Arrays are indexed by page (0..n-1)."""

    index: int
    capacity_bytes: int  # HBM budget for this batch
    types: np.ndarray  # int8 index into TYPE_ORDER: the type the page is produced with
    sizes: np.ndarray  # int64 full-precision bytes
    created: np.ndarray  # float64 seconds
    eol: np.ndarray  # float64: when the end of life happens (inf = never); synthetic: never
    # followed by a read; a trace: its own end event, which a later session may outlive
    access_times: Sequence[np.ndarray]  # per page, sorted reuse times (may be empty)
    predicted_idle: Sequence[np.ndarray]  # per page, one prediction per idle gap
    jitter_ms: np.ndarray  # float64 per page: queueing jitter of its restores
    sessions: Sequence[str] = ()  # per page; empty = one session per batch
    tool_classes: Sequence[str] = ()  # per page; "" = unknown
    eol_kind: np.ndarray | None = None  # int8 index into SIGNAL_ORDER (None: TASK_END)
    recompute_s: np.ndarray | None = None  # TRUE re-prefill seconds (None: from the type)
    recompute_est_s: np.ndarray | None = None  # the cost model's estimate (None: = truth)
    correctness: np.ndarray | None = None  # TRUE correctness weight (None: type default)
    # per page, per idle gap (gap k ends in read k; the last is the tail after the
    # last read): the tool class that runs in it and the tool's own duration
    # (0 = unknown: the gap is model time only, or the trace does not say)
    gap_tools: Sequence[tuple[str, ...]] = ()
    gap_tool_s: Sequence[np.ndarray] = ()
    # ... and when that tool started (nan: no tool in the gap, or unknown): a driver is
    # told it once it is past, whether or not the page is read again (a live service
    # sees the tool_start event either way)
    gap_tool_start: Sequence[np.ndarray] = ()
    # signals as delivered (signal-quality model applied; None = at ``eol``, all of them)
    signal_at: np.ndarray | None = None
    false_signal_at: np.ndarray | None = None  # premature "dead" signals (inf = none)
    # type changes, seen when they happen (None: none): from ``retype_at`` (float64, inf =
    # never) the page is of type ``retype_to`` (int8 index into TYPE_ORDER): a block a
    # second session reads becomes a fixed prefix, a branch abandoned a failed branch
    retype_at: np.ndarray | None = None
    retype_to: np.ndarray | None = None

    @property
    def n_pages(self) -> int:
        return int(self.sizes.shape[0])


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Batches plus where they came from (printed with the results); ``sessions``: how
    many sessions a replayed trace holds (None for the synthetic presets)."""

    source: str
    batches: Sequence[Batch]
    sessions: int | None = None

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
    recompute = sizes / MB * np.array([p.recompute_ms_per_mb for p in params])[types] / 1e3
    weight = np.array([p.correctness_weight for p in params])[types]
    # Fresh prediction and cost-model errors per noise level (module doc).
    nrng = noise_rng(cfg.seed, cfg.noise)
    predicted = idle * np.exp(cfg.noise * nrng.standard_normal(gshape))
    recompute_est = recompute * np.exp(cfg.cost_error * nrng.standard_normal(shape))
    kinds = _KIND_OF_TYPE[types]
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
            eol_kind=kinds[b],
            recompute_s=recompute[b],
            recompute_est_s=recompute_est[b],
            correctness=weight[b],
        ))
    return Workload(source=f"synthetic(seed={cfg.seed})", batches=batches)
