"""Signal-quality model: how an orchestrator's end-of-life signals reach the cache.

A workload knows when each page's end of life really happens (``Batch.eol``,
never followed by a read). What the cache receives is worse:

- ``miss``: each signal is lost with this probability (the page stays until evicted);
- ``delay_s``: each delivered signal arrives this many seconds late;
- ``false_rate``: each page that will still be read gets, with this probability, a
  premature "dead" signal inside one of its remaining idle gaps (uniformly placed).
  A policy that acts on it drops every copy; the next read then pays a full
  recompute (re-prefill), which the metrics count (``false_signal_reads``,
  ``false_signal_ms_per_batch``).

The draws come from a stream keyed by (seed, batch, quality), so every policy in
one run sees exactly the same delivered and false signals (common random numbers).
Applying the model never moves a signal earlier than its event: a delivered true
signal lands at ``eol + delay_s`` (tests check it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentkv_cluster.sim.config import SignalQuality, SignalQualityError
from agentkv_cluster.sim.workload import Batch, Workload

__all__ = ["PERFECT", "SignalQuality", "SignalQualityError", "degrade", "degrade_workload"]

SIGNAL_STREAM = 0x7369676E  # "sign"


PERFECT = SignalQuality()


def _rng(seed: int, batch: int, q: SignalQuality) -> np.random.Generator:
    key = [seed, SIGNAL_STREAM, batch, round(q.miss * 1e6), round(q.false_rate * 1e6)]
    return np.random.Generator(np.random.PCG64(key))


def degrade(batch: Batch, q: SignalQuality, seed: int) -> Batch:
    """``batch`` with its signals as delivered under ``q``."""
    if q.perfect:
        return dataclasses.replace(batch, signal_at=None, false_signal_at=None)
    rng = _rng(seed, batch.index, q)
    n = batch.n_pages
    lost = rng.random(n) < q.miss
    signal_at = np.where(lost, np.inf, batch.eol + q.delay_s)
    signal_at = np.where(np.isfinite(batch.eol), signal_at, np.inf)
    false_at = np.full(n, np.inf)
    u_false, u_gap, u_pos = rng.random(n), rng.random(n), rng.random(n)
    for i in range(n):
        reads = batch.access_times[i]
        if not len(reads) or u_false[i] >= q.false_rate:
            continue
        k = min(int(u_gap[i] * len(reads)), len(reads) - 1)  # the gap that ends in read k
        start = float(reads[k - 1]) if k else float(batch.created[i])
        false_at[i] = start + u_pos[i] * (float(reads[k]) - start)
    return dataclasses.replace(batch, signal_at=signal_at, false_signal_at=false_at)


def degrade_workload(workload: Workload, q: SignalQuality, seed: int) -> Workload:
    return dataclasses.replace(workload, batches=[degrade(b, q, seed) for b in workload.batches])
