"""A replayed trace costs a few bytes per request, not an object per event, page or read.

Measured with tracemalloc as the growth between two trace sizes (so fixed costs and
caches cancel out), in bytes per request: what the parsed trace holds (the CLI keeps
it for every replay of a sweep), the peak while the replay's batch is built, and
the peak while a policy runs it. The held bound is about twice what the columns
need and well below the object per event they replace (about 670 B per request on
this trace); the build bound leaves room for numpy temporaries. A run holds state
for the pages live at once (the event loop's queue and page records), so on a
trace whose sessions follow one another it grows only by what it records per read
and a few numbers per page; queueing every event up front and keeping every page's
record grew by about 1,600 B per request.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.engine import BatchTrace
from agentkv_cluster.sim.metrics import summarize
from agentkv_cluster.sim.runner import compact_trace, run_policy
from agentkv_cluster.sim.trace.convert import load_trace
from agentkv_cluster.sim.trace.replay import replay_workload
from agentkv_cluster.sim.trace.table import EventTable, TraceEvent
from tests.support.mooncake_scale import write_mooncake

HELD_PER_REQUEST = 300  # bytes; the columns need about 160
BUILD_PEAK_PER_REQUEST = 1_500  # bytes; about 850 now (numpy temporaries)
RUN_PEAK_PER_REQUEST = 800  # bytes; about 370 now (1,750 before)
TURNS, FIRST_BLOCKS = 5, 3  # as tests/support/mooncake_scale.py: 1.4 blocks, 3.6 reads


def _measure(tmp_path, conversations: int) -> tuple[int, int, int]:
    path = tmp_path / f"m{conversations}.jsonl"
    requests = write_mooncake(path, conversations)
    gc.collect()
    tracemalloc.start()
    try:
        parsed = load_trace(path, "mooncake")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        replay_workload(parsed.events, SimConfig(), str(path))
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    return requests, held, peak


def test_a_parsed_trace_and_its_replay_cost_bytes_not_objects_per_request(tmp_path):
    _measure(tmp_path, 50)  # warm: first-use caches are not the trace's
    n1, held1, peak1 = _measure(tmp_path, 400)
    n2, held2, peak2 = _measure(tmp_path, 800)
    per_held = (held2 - held1) / (n2 - n1)
    per_peak = (peak2 - peak1) / (n2 - n1)
    assert per_held < HELD_PER_REQUEST, f"parsed trace holds {per_held:.0f} B per request"
    assert per_peak < BUILD_PEAK_PER_REQUEST, f"building peaks at {per_peak:.0f} B per request"


def _one_after_another(sessions: int) -> list[TraceEvent]:
    """Sessions far apart (each ends before the next starts); every turn extends the
    session's context by one block, as in mooncake_scale."""
    events = []
    for k in range(sessions):
        base = k * 1000.0
        first = k * (FIRST_BLOCKS + TURNS - 1)
        for turn in range(TURNS):
            events.append(TraceEvent(session=f"s{k}", ts=base + 30.0 * turn,
                                     kind="model_call", tokens=512,
                                     prefix_blocks=tuple(range(first,
                                                               first + FIRST_BLOCKS + turn))))
        events.append(TraceEvent(session=f"s{k}", ts=base + 200.0, kind="task_end"))
    return events


def _run_peak(sessions: int) -> int:
    workload = replay_workload(_one_after_another(sessions), SimConfig(), "sequential")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run_policy(workload, SimConfig(), "lru")
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_run_holds_state_for_the_pages_live_at_once_not_for_every_event():
    _run_peak(20)  # warm
    peak1, peak2 = _run_peak(300), _run_peak(600)
    per_request = (peak2 - peak1) / (300 * TURNS)
    assert per_request < RUN_PEAK_PER_REQUEST, f"a run peaks at {per_request:.0f} B per request"


def test_compact_read_columns_give_the_same_metrics_as_lists():
    rng = np.random.default_rng(3)
    lists, typed = BatchTrace(), compact_trace()
    for _ in range(500):
        row = (int(rng.integers(1, 1 << 40)), bool(rng.random() < 0.5), float(rng.random()),
               float(rng.random() * 10), float(rng.random()), float(rng.random()),
               float(rng.random()))
        for trace in (lists, typed):
            trace.access_bytes.append(row[0])
            trace.access_hit.append(row[1])
            trace.access_visible_ms.append(row[2])
            trace.access_restore_ms.append(row[3])
            trace.access_risk.append(row[4])
            trace.access_weight.append(row[5])
            trace.access_wrong.append(row[6])
    assert summarize(typed, 1) == summarize(lists, 1)


def test_the_columns_give_back_every_event_as_read_block_ids_beyond_int64_too():
    events = [
        TraceEvent(session="s1", ts=0.0, kind="model_call", tokens=1500,
                   prefix_blocks=(0, 1, 2), state=StateType.TASK_INPUT),
        TraceEvent(session="s1", ts=0.5, kind="tool_start", tool_class="search",
                   tool_duration_s=4.25, block_tokens=256),
        TraceEvent(session="s2", ts=1.0, kind="model_call", tokens=10,
                   prefix_blocks=(0, 2**70, -3)),
        TraceEvent(session="s2", ts=2.0, kind="observation_return", tokens=7),
        TraceEvent(session="s2", ts=3.0, kind="model_call", tokens=10, prefix_blocks=()),
        TraceEvent(session="s1", ts=9.0, kind="task_end"),
    ]
    table = EventTable.from_events(events)
    assert list(table) == events and table == events and len(table) == 6
    assert table[-1] == events[-1] and table[1:3] == events[1:3]
    # ids beyond int64 keep their order and identity for the replay (as ranks)
    assert table.columns().blocks.tolist() == [1, 2, 3, 1, 4, 0]
