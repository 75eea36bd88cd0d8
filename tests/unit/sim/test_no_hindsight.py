"""What the loop tells a driver about tool calls is what a live service knows by then:
a tool's start only once it has started, a tool's duration only at the read that
ends its gap (never the next gap's)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

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


def _with_tools(batch, secs, starts=None):
    """``secs[i]``: page i's tool seconds per gap (gap k ends in read k; the last is
    the tail after the last read, 0 = unknown); ``starts[i]``: when each started."""
    starts = starts or [[np.nan] * len(s) for s in secs]
    return dataclasses.replace(batch, gap_tool_s=tuple(np.array(s, float) for s in secs),
                               gap_tool_start=tuple(np.array(s, float) for s in starts),
                               gap_tools=tuple(("tool",) * len(s) for s in secs))


def _evicted_at(evict_at: float, read_again: bool = True):
    # A (100 MB) waits on a 3 s tool that started at 7.0 (and ends in its read at 10.0,
    # if it is read again); B's production at ``evict_at`` evicts A
    reads = [[10.0], []] if read_again else [[], []]
    batch = make_batch(sizes_mb=[100, 100], created=[0.0, evict_at], reads=reads,
                       capacity_mb=150)
    secs = [[3.0, 0.0], [0.0]] if read_again else [[3.0], [0.0]]
    starts = [[7.0, np.nan], [np.nan]] if read_again else [[7.0], [np.nan]]
    return _with_tools(batch, secs, starts)


def test_a_tool_start_is_not_told_before_it_happens():
    driver = _Told()
    BatchRun(_evicted_at(5.0), driver).run()
    assert (0, 5.0, None) in driver.starts


@pytest.mark.parametrize("read_again", [True, False])
def test_a_tool_start_is_told_once_it_has_happened_read_again_or_not(read_again):
    """The start was derived from the page's next read (its time minus the tool's
    seconds), so a page never read again was told none: the answer leaked the future."""
    driver = _Told()
    BatchRun(_evicted_at(8.0, read_again), driver).run()
    assert (0, 8.0, 7.0) in driver.starts


def test_a_read_teaches_the_duration_of_the_tool_of_the_gap_it_ends():
    # gaps of A: [0, 2] with a 1.5 s tool, [2, 6] with a 3 s tool, then the tail (9 s)
    batch = make_batch(sizes_mb=[10], created=[0.0], reads=[[2.0, 6.0]], capacity_mb=100)
    driver = _Told()
    BatchRun(_with_tools(batch, [[1.5, 3.0, 9.0]]), driver).run()
    assert driver.reads == [(0, 2.0, 1.5), (0, 4.0, 3.0)]


def test_agent_loop_tool_starts_are_the_tools_own_and_known_without_a_next_read():
    """Each gap's tool start is when the tool began (the model's answer done), read again
    or not: an abandoned branch's last gap has its tool's start too."""
    from agentkv_cluster.sim.agent_loop import agent_loop_workload
    from agentkv_cluster.sim.config import SimConfig

    wl = agent_loop_workload(SimConfig(seed=5).replace(
        workload=dataclasses.replace(SimConfig().workload, batches=3)))
    unread = 0
    for b in wl.batches:
        for i, starts in enumerate(b.gap_tool_start):
            reads, secs = b.access_times[i], b.gap_tool_s[i]
            for k in np.flatnonzero(np.isfinite(starts)):
                assert b.created[i] <= starts[k] <= b.eol[i]
                if k < len(reads):  # the tool ends in this read
                    assert starts[k] == pytest.approx(reads[k] - secs[k])
                else:
                    unread += 1  # a tool ran after the page's last read
    assert unread
