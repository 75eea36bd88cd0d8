"""What the loop tells a driver about tool calls is what a live service knows by then:
a tool's start only once it has started, a tool's duration only at the read that
ends its gap (never the next gap's)."""

from __future__ import annotations

import dataclasses

import numpy as np

from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import BatchRun
from tests.unit.sim.conftest import make_batch


class _Told(FullPrecisionDriver):
    """LRU at full precision; records what the loop passes on about tools."""

    def __init__(self) -> None:
        super().__init__(LruPolicy(), SimConfig())
        self.starts: list[tuple[int, float, float | None]] = []  # page, now, tool_started
        self.reads: list[tuple[int, float, float]] = []  # page, idle_s, tool_s

    def prefetch_at(self, page, demotion, now, tool_started=None):
        self.starts.append((page.page_id, now, tool_started))

    def observe_read(self, page, idle_s, tool_s, now) -> None:
        self.reads.append((page.page_id, idle_s, tool_s))


def _with_tools(batch, secs):
    """``secs[i]``: page i's tool seconds per gap (gap k ends in read k; the last is
    the tail after the last read, 0 = unknown)."""
    return dataclasses.replace(batch, gap_tool_s=tuple(np.array(s, float) for s in secs),
                               gap_tools=tuple(("tool",) * len(s) for s in secs))


def _evicted_at(evict_at: float):
    # A (100 MB) waits on a 3 s tool that ends in its read at 10.0, i.e. started at 7.0;
    # B's production at ``evict_at`` evicts A
    batch = make_batch(sizes_mb=[100, 100], created=[0.0, evict_at], reads=[[10.0], []],
                       capacity_mb=150)
    return _with_tools(batch, [[3.0, 0.0], [0.0]])


def test_a_tool_start_is_not_told_before_it_happens():
    driver = _Told()
    BatchRun(_evicted_at(5.0), driver).run()
    assert (0, 5.0, None) in driver.starts


def test_a_tool_start_is_told_once_it_has_happened():
    driver = _Told()
    BatchRun(_evicted_at(8.0), driver).run()
    assert (0, 8.0, 7.0) in driver.starts


def test_a_read_teaches_the_duration_of_the_tool_of_the_gap_it_ends():
    # gaps of A: [0, 2] with a 1.5 s tool, [2, 6] with a 3 s tool, then the tail (9 s)
    batch = make_batch(sizes_mb=[10], created=[0.0], reads=[[2.0, 6.0]], capacity_mb=100)
    driver = _Told()
    BatchRun(_with_tools(batch, [[1.5, 3.0, 9.0]]), driver).run()
    assert driver.reads == [(0, 2.0, 1.5), (0, 4.0, 3.0)]
