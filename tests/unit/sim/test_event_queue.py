"""The event queue makes events as they come due, in the order a queue of every event
would give: (time, kind, sequence), sequence numbered page after page (production,
reads, end-of-life signal, false signal), prefetches after all of those."""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pytest

from agentkv_cluster.sim.schedule import (
    ACCESS,
    CREATE,
    EOL,
    FALSE,
    PREFETCH,
    EventQueue,
    UnorderedBatch,
)
from tests.unit.sim.conftest import make_batch


def _batch(seed: int, n: int = 60):
    """Whole-second times: many events at one instant, of one kind and of several."""
    rng = np.random.default_rng(seed)
    created = rng.integers(0, 20, n).astype(float)
    reads = [np.sort(c + rng.integers(0, 8, rng.integers(0, 5))).tolist() for c in created]
    eol = np.where(rng.random(n) < 0.2, np.inf, created + rng.integers(-3, 12, n))
    false = np.where(rng.random(n) < 0.5, np.inf, created + rng.integers(-3, 12, n))
    batch = make_batch(sizes_mb=[1] * n, created=created.tolist(), reads=reads,
                       capacity_mb=10, eol=eol.tolist())
    return dataclasses.replace(batch, false_signal_at=false)


def _every_event_up_front(batch) -> list[tuple[float, int, int, int]]:
    """The queue of every event at once (and the sequence number they leave)."""
    heap, seq = [], 0
    for i in range(batch.n_pages):
        times = [(float(batch.created[i]), CREATE)]
        times += [(float(t), ACCESS) for t in batch.access_times[i]]
        times += [(float(a[i]), kind) for a, kind in ((batch.eol, EOL),
                                                      (batch.false_signal_at, FALSE))
                  if np.isfinite(a[i])]
        for t, kind in times:
            seq += 1
            heap.append((t, kind, seq, i))
    heapq.heapify(heap)
    return heap, seq


@pytest.mark.parametrize("seed", range(8))
def test_events_come_in_the_order_of_a_queue_of_every_event(seed):
    batch = _batch(seed)
    reference, seq = _every_event_up_front(batch)
    queue = EventQueue(batch)
    rng = np.random.default_rng(seed + 100)
    produced: set[int] = set()
    popped = 0
    while reference:
        t, kind, s, page = heapq.heappop(reference)
        if kind in (EOL, FALSE) and page not in produced:
            continue  # a signal before its page exists: nothing to act on, not queued
        if kind == CREATE:
            produced.add(page)
        assert queue.pop()[:4] == (t, kind, s, page)
        popped += 1
        if rng.random() < 0.3:  # the loop plans a prefetch: numbered after everything
            seq += 1
            at = t + float(rng.integers(0, 4))
            heapq.heappush(reference, (at, PREFETCH, seq, page))
            queue.push_prefetch(at, page, 7)
    assert not queue and popped > 100
    assert queue.peak < popped  # never every event at once


def test_a_page_is_due_its_reads_and_the_signals_from_its_production():
    batch = dataclasses.replace(
        make_batch(sizes_mb=[1, 1], created=[5.0, 5.0], reads=[[6.0, 7.0], []],
                   capacity_mb=10, eol=[4.0, 5.0]),
        false_signal_at=np.array([9.0, np.inf]))
    queue = EventQueue(batch)
    assert (queue.due(0), queue.due(1)) == (3, 1)  # page 0's signal came before it


@pytest.mark.parametrize(("created", "reads", "what"), [
    ([1.0, 2.0], [[3.0, 2.5], []], "page 0: reads not sorted"),
    ([1.0, 2.0], [[3.0], [1.5]], "page 1: read at 1.5 before it is produced at 2.0"),
    ([1.0, 2.0], [[float("nan")], []], "page 0: read at nan"),
    ([float("nan"), 2.0], [[], []], "page 0: its creation time is not a number"),
])
def test_a_batch_out_of_order_is_refused_before_any_event(created, reads, what):
    batch = make_batch(sizes_mb=[1, 1], created=created, reads=reads, capacity_mb=10)
    with pytest.raises(UnorderedBatch, match=what):
        EventQueue(batch)
