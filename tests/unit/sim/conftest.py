"""Small hand-built batches for exact expectations."""

from __future__ import annotations

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import MB
from agentkv_cluster.sim.workload import TYPE_ORDER, Batch


def make_batch(*, sizes_mb, created, reads, capacity_mb, types=None, predicted=None,
               eol=None, jitter_ms=None) -> Batch:
    """A batch from per-page lists; reads[i] is the list of read times of page i."""
    n = len(sizes_mb)
    types = types or [StateType.TEMP_REASONING] * n
    predicted = predicted or [[max(r[0] - c, 1e-3)] if r else [1.0]
                              for r, c in zip(reads, created)]
    return Batch(
        index=0,
        capacity_bytes=int(capacity_mb * MB),
        types=np.array([TYPE_ORDER.index(t) for t in types], dtype=np.int8),
        sizes=np.array([int(s * MB) for s in sizes_mb], dtype=np.int64),
        created=np.array(created, dtype=np.float64),
        eol=np.array(eol if eol is not None else [np.inf] * n, dtype=np.float64),
        access_times=tuple(np.array(r, dtype=np.float64) for r in reads),
        predicted_idle=tuple(np.array(p, dtype=np.float64) for p in predicted),
        jitter_ms=np.array(jitter_ms if jitter_ms is not None else [0.0] * n),
    )
