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
    assert [(t.session, t.ts, t.tool_duration_s) for t in tools] == [("conv-0", 0.0, 4.0)]
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


def test_replay_builds_pages_reads_and_types():
    events = parse_lines(json.dumps(d) for d in GOOD + [
        {"session": "s2", "ts": 1.0, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]},
    ]).events
    cfg = SimConfig(noise=0.0)
    wl = replay_workload(events, cfg, "test", ReplayConfig(kv_bytes_per_token=1000,
                                                            pages_per_batch=100))
    (b,) = wl.batches
    assert b.n_pages == 3
    assert list(b.sizes) == [512_000] * 3
    assert [list(r) for r in b.access_times] == [[1.0, 3.5], [3.5], []]
    assert TYPE_ORDER[b.types[0]] is StateType.FIXED_PREFIX  # shared by s1 and s2
    assert TYPE_ORDER[b.types[1]] is StateType.TASK_INPUT
    assert TYPE_ORDER[b.types[2]] is StateType.TOOL_OBSERVATION
    # noise 0: predictions are exact; the gap after the last read repeats the last one
    assert np.allclose(b.predicted_idle[0], [1.0, 2.5, 2.5])
    assert b.eol[0] == 4.0 and b.capacity_bytes == int(0.35 * (3 * 512_000))


def test_replay_without_model_calls_is_an_error():
    events = [TraceEvent(session="s", ts=0.0, kind="task_end")]
    with pytest.raises(TraceFormatError, match="no model_call"):
        replay_workload(events, SimConfig(), "empty")


def test_line_error_str():
    assert str(LineError(7, "bad")) == "line 7: bad"
