"""Trace format, converters and replay on small files written by the tests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.trace.convert import (
    convert_azure,
    convert_mooncake,
    convert_tracelab,
    load_trace,
)
from agentkv_cluster.sim.trace.format import (
    LineError,
    TraceEvent,
    TraceFormatError,
    parse_lines,
    read_trace,
    write_trace,
)
from agentkv_cluster.sim.trace.replay import ReplayConfig, replay_workload
from agentkv_cluster.sim.workload import TYPE_ORDER

GOOD = [
    {"session": "s1", "ts": 0.0, "kind": "model_call", "tokens": 1024, "prefix_blocks": [1, 2]},
    {"session": "s1", "ts": 0.5, "kind": "tool_start", "tool_class": "search",
     "tool_duration_s": 3.0},
    {"session": "s1", "ts": 3.5, "kind": "model_call", "tokens": 1536,
     "prefix_blocks": [1, 2, 3], "state": "tool_observation"},
    {"session": "s1", "ts": 4.0, "kind": "task_end"},
]


def test_malformed_lines_are_reported_with_their_line_numbers():
    lines = [json.dumps(GOOD[0]), "{not json", json.dumps({**GOOD[1], "kind": "teleport"}),
             "", json.dumps({"session": "s1", "kind": "model_call", "ts": 1.0,
                             "prefix_blocks": [1]}),
             json.dumps({**GOOD[1], "tool_duration_s": -2}), json.dumps([1, 2]),
             json.dumps(GOOD[3])]
    res = parse_lines(lines)
    assert [e.kind for e in res.events] == ["model_call", "task_end"]
    assert [e.line for e in res.errors] == [2, 3, 5, 6, 7]
    assert "invalid JSON" in res.errors[0].reason
    assert "unknown event kind 'teleport'" in res.errors[1].reason
    assert "missing field 'tokens'" in res.errors[2].reason
    assert "'tool_duration_s' must be >= 0" in res.errors[3].reason
    assert "expected a JSON object" in res.errors[4].reason
    assert res.lines == 8
    assert str(res.errors[0]).startswith("line 2: ")


def test_write_then_read_round_trips(tmp_path):
    events = parse_lines(json.dumps(d) for d in GOOD).events
    path = tmp_path / "t.jsonl"
    assert write_trace(events, path) == 4
    again = read_trace(path)
    assert again.errors == [] and again.events == events
    assert again.events[2].state is StateType.TOOL_OBSERVATION


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(TraceFormatError, match="unknown trace format 'xml'"):
        load_trace(tmp_path / "absent.jsonl", "xml")


def test_mooncake_turns_continue_conversations_and_gaps_become_tool_gaps(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 100, "input_length": 900, "output_length": 5, "hash_ids": [0, 7]},
        {"timestamp": 4000, "input_length": 2500, "output_length": 9,
         "hash_ids": [0, 1, 2, 3, 4]},
        {"timestamp": 5000, "input_length": -1, "output_length": 1, "hash_ids": [9]},
    ]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{oops\n")
    res = convert_mooncake(path)
    assert [(e.line, e.reason.split(" (")[0]) for e in res.errors] == [
        (4, "timestamp and input_length must be >= 0"), (5, "invalid JSON")]
    calls = [e for e in res.events if e.kind == "model_call"]
    assert [c.session for c in calls] == ["conv-0", "conv-1", "conv-0"]
    tools = [e for e in res.events if e.kind == "tool_start"]
    # every turn opens a think gap, the last ones too (length unknown: 0), so a gap's
    # label never tells whether the conversation comes back
    assert sorted((t.session, t.ts, t.tool_duration_s) for t in tools) == [
        ("conv-0", 0.0, 4.0), ("conv-0", 4.0, 0.0), ("conv-1", 0.1, 0.0)]
    assert calls[2].state is StateType.TOOL_OBSERVATION


def test_azure_requests_are_one_call_sessions(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.9799600,1100,10\n"
                    "2023-11-16 18:17:04.0319600,abc,8\n"
                    "2023-11-16 18:17:05.4799600,10,8\n")
    res = convert_azure(path)
    assert [e.line for e in res.errors] == [3]
    calls = [e for e in res.events if e.kind == "model_call"]
    assert [c.ts for c in calls] == pytest.approx([0.0, 1.5])
    assert [len(c.prefix_blocks) for c in calls] == [3, 1]
    assert set(calls[0].prefix_blocks).isdisjoint(calls[1].prefix_blocks)


def test_tracelab_keeps_prefix_blocks_and_real_tool_latencies(tmp_path):
    def rnd(i, ts, total, prefix, tools):
        return {"session_id": "a", "input_tokens_total": total, "prefix_tokens": prefix,
                "timing_events": [{"timestamp": ts}],
                "tools": [{"tool_name": n, "emitted_at": ts, "tool_wall_latency_ms": ms}
                          for n, ms in tools]}
    path = tmp_path / "tl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        rnd(0, "2026-06-01T05:40:20.000Z", 2048, 0, [("Bash", 860)]),
        rnd(1, "2026-06-01T05:40:30.000Z", 2600, 2048, []),
        {"session_id": "a"},
    ]) + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [3]
    calls = [e for e in res.events if e.kind == "model_call"]
    assert calls[0].prefix_blocks == (0, 1, 2, 3)
    assert calls[1].prefix_blocks == (0, 1, 2, 3, 4, 5)
    tools = [e for e in res.events if e.kind == "tool_start"]
    assert [(t.tool_class, t.tool_duration_s) for t in tools] == [("Bash", 0.86)]
    assert not [e for e in res.events if e.kind == "task_end"]  # the trace never says so


def test_tracelab_negative_latency_is_reported_and_the_export_reloads(tmp_path):
    row = {"session_id": "a", "input_tokens_total": 600, "prefix_tokens": 0,
           "timing_events": [{"timestamp": "2026-06-01T05:40:20.000Z"}],
           "tools": [{"tool_name": "Bash", "emitted_at": "2026-06-01T05:40:20.000Z",
                      "tool_wall_latency_ms": -5}]}
    good = {**row, "tools": []}
    path = tmp_path / "tl.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [2]
    assert "tool_wall_latency_ms" in res.errors[0].reason
    out = tmp_path / "out.jsonl"
    write_trace(res.events, out)
    again = read_trace(out)
    assert again.errors == [] and again.events == res.events


def test_mooncake_conversion_invents_no_task_end(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1,
                                "hash_ids": [0, 1]}) + "\n")
    assert [e.kind for e in convert_mooncake(path).events] == ["model_call", "tool_start"]


def test_replay_is_one_timeline_with_every_read_and_per_gap_tools():
    events = parse_lines(json.dumps(d) for d in GOOD + [
        {"session": "s2", "ts": 1.0, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]},
        # s3 reads block 1 at the same instant as s1: both reads count
        {"session": "s3", "ts": 3.5, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]},
    ]).events
    cfg = SimConfig(noise=0.0)
    wl = replay_workload(events, cfg, "test", ReplayConfig(kv_bytes_per_token=1000,
                                                            idle_timeout_s=10.0))
    (b,) = wl.batches  # one timeline: every session shares one HBM budget and link
    assert b.n_pages == 3 and set(b.sessions) == {"s1"}
    assert list(b.sizes) == [512_000] * 3
    assert [list(r) for r in b.access_times] == [[1.0, 3.5, 3.5], [3.5], []]
    # block 1 is produced as s1's input and is a shared prefix from s2's read at 1.0 on
    # (before, it was typed FIXED_PREFIX from production: hindsight)
    assert [TYPE_ORDER[t] for t in b.types] == [
        StateType.TASK_INPUT, StateType.TASK_INPUT, StateType.TOOL_OBSERVATION]
    assert list(b.retype_at) == [1.0, np.inf, np.inf]
    assert TYPE_ORDER[b.retype_to[0]] is StateType.FIXED_PREFIX
    # each gap is labelled at its start with the tool its opening session starts next
    # (s1's search after its call at 0; none after s2's and s1's later calls), whether
    # or not a read follows; the duration is what the reading call waited on: block
    # 1's gap to s2's read none, its gap to s1's read at 3.5 s1's search (3 s)
    assert b.gap_tools[0] == ("search", "", "", "")
    assert list(b.gap_tool_s[0][:2]) == [0.0, 3.0]
    assert b.gap_tools[1] == ("search", "") and b.gap_tool_s[1][0] == 3.0
    # and when that tool started, from its own event (not from the read that ends the gap)
    assert np.array_equal(b.gap_tool_start[0], [0.5, np.nan, np.nan, np.nan], equal_nan=True)
    assert np.array_equal(b.gap_tool_start[1], [0.5, np.nan], equal_nan=True)
    # noise 0: gap predictions are exact; after the last read the guess is a typical
    # gap (the page's median), never the time to its signal (13.5 - 3.5 here)
    assert np.allclose(b.predicted_idle[0], [1.0, 2.5, 1e-3, 1.0])
    # s1 ends at its task_end (4.0); s2 and s3 never say so: idle timeout 10 s
    assert b.eol[1] == 4.0 and b.eol[2] == 4.0
    assert b.eol[0] == 3.5 + 10.0
    # capacity: budget x peak live bytes (blocks 1, 2 and 3 overlap)
    assert b.capacity_bytes == int(0.35 * (3 * 512_000))


def test_replay_never_signals_before_the_event_it_comes_from():
    """A block's signal fires when the sessions that held it so far have ended, at
    that moment: never before the end of a session that still held it, never at a
    later session's end (no hindsight); a later reader finds the signal already sent."""
    events = [
        TraceEvent(session="a", ts=0.0, kind="model_call", tokens=512, prefix_blocks=(1,)),
        TraceEvent(session="a", ts=2.0, kind="model_call", tokens=512, prefix_blocks=(1,)),
        TraceEvent(session="a", ts=3.0, kind="task_end"),
        # b starts after a ended and reuses block 1: the signal at 3.0 already happened
        TraceEvent(session="b", ts=5.0, kind="model_call", tokens=512, prefix_blocks=(1, 2)),
        TraceEvent(session="b", ts=9.0, kind="task_end"),
        # c overlaps d: block 3's signal waits for both
        TraceEvent(session="c", ts=0.0, kind="model_call", tokens=512, prefix_blocks=(3,)),
        TraceEvent(session="d", ts=1.0, kind="model_call", tokens=512, prefix_blocks=(3,)),
        TraceEvent(session="c", ts=1.5, kind="task_end"),
    ]
    wl = replay_workload(events, SimConfig(), "t", ReplayConfig(idle_timeout_s=60.0))
    (b,) = wl.batches
    block1 = b.sessions.index("a")
    block3 = b.sessions.index("c")
    assert b.eol[block1] == 3.0  # a's task_end; not b's end at 9.0 (hindsight)
    assert list(b.access_times[block1]) == [2.0, 5.0]  # b's read comes after the signal
    assert b.eol[block3] == 1.0 + 60.0  # d never ended: its idle timeout, not c's end
    for i in range(b.n_pages):  # every signal at or after a session end it derives from
        assert b.eol[i] >= 1.5


def test_replay_of_a_sample_keeps_whole_sessions():
    events = parse_lines(json.dumps(d) for d in GOOD + [
        {"session": "s2", "ts": 1.0, "kind": "model_call", "tokens": 512, "prefix_blocks": [9]},
    ]).events
    wl = replay_workload(events, SimConfig(), "t", ReplayConfig(sessions=1))
    (b,) = wl.batches
    assert set(b.sessions) == {"s1"} and b.n_pages == 3  # all of s1, nothing of s2


def test_replay_without_model_calls_is_an_error():
    events = [TraceEvent(session="s", ts=0.0, kind="task_end")]
    with pytest.raises(TraceFormatError, match="no model_call"):
        replay_workload(events, SimConfig(), "empty")


def test_line_error_str():
    assert str(LineError(7, "bad")) == "line 7: bad"
