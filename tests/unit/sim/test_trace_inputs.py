"""Traces the converters had not seen: odd values, odd encodings, odd order.

Every bad value is a line error with its line number (never a traceback, never NaN in
a table); harmless variations (a byte-order mark, gzip, an unsorted file) read as the
plain file does.
"""

from __future__ import annotations

import gzip
import json

import pytest

from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.trace.convert import convert_azure, convert_mooncake, convert_tracelab
from agentkv_cluster.sim.trace.format import (
    TraceEvent,
    TraceFormatError,
    parse_lines,
    read_trace,
    write_trace,
)
from agentkv_cluster.sim.trace.replay import ReplayConfig, replay_workload

CALL = '{"session": "s", "ts": 0, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]}'
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _mooncake_row(ts, blocks, tokens=600):
    return json.dumps({"timestamp": ts, "input_length": tokens, "output_length": 1,
                       "hash_ids": blocks})


def test_non_finite_or_absurd_numbers_are_line_errors():
    lines = [
        CALL,
        '{"session": "s", "ts": Infinity, "kind": "task_end"}',
        '{"session": "s", "ts": 1e400, "kind": "task_end"}',
        ('{"session": "s", "ts": 1, "kind": "tool_start", "tool_class": "x", '
         '"tool_duration_s": Infinity}'),
        '{"session": "s", "ts": 1e13, "kind": "task_end"}',
        ('{"session": "s", "ts": 2, "kind": "model_call", "tokens": 1, "prefix_blocks": [1], '
         '"block_tokens": 1000000000000000}'),
    ]
    res = parse_lines(lines)
    assert [e.line for e in res.errors] == [2, 3, 4, 5, 6]
    assert "'ts' must be a finite number" in res.errors[0].reason
    assert "'tool_duration_s' must be a finite number" in res.errors[2].reason
    assert "'ts' must be <= 1e+12 s" in res.errors[3].reason
    assert "'block_tokens' must be <=" in res.errors[4].reason
    assert len(res.events) == 1


@pytest.mark.parametrize("stamp", ["NaN", "Infinity", "1e400", "1e300"])
def test_mooncake_timestamp_that_is_not_a_time_is_a_line_error(tmp_path, stamp):
    path = tmp_path / "mc.jsonl"
    path.write_text(_mooncake_row(0, [0, 1]) + "\n"
                    + f'{{"timestamp": {stamp}, "input_length": 9, "hash_ids": [0, 1, 2]}}\n')
    res = convert_mooncake(path)
    assert [e.line for e in res.errors] == [2]
    assert "timestamp" in res.errors[0].reason
    assert all(0 <= e.ts <= 1e12 for e in res.events)


def test_mooncake_groups_turns_in_time_order_whatever_the_file_order(tmp_path):
    rows = [_mooncake_row(0, [0, 1]), _mooncake_row(10, [5, 6]),
            _mooncake_row(2000, [0, 1, 2]), _mooncake_row(3000, [0, 1, 2, 3])]
    plain, shuffled = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plain.write_text("\n".join(rows) + "\n")
    shuffled.write_text("\n".join(reversed(rows)) + "\n")
    a, b = convert_mooncake(plain), convert_mooncake(shuffled)
    assert not a.errors and not b.errors
    key = lambda e: (e.ts, e.session, e.kind)
    assert sorted(b.events, key=key) == sorted(a.events, key=key)
    calls = [e for e in b.events if e.kind == "model_call"]
    assert len({c.session for c in calls}) == 2  # one conversation of three turns, one alone


def test_azure_times_count_from_the_earliest_request_and_the_export_reloads(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 18:17:05.0000000,1100,10\n"
                    "2023-11-16 18:17:03.0000000,10,8\n")
    res = convert_azure(path)
    assert not res.errors
    assert sorted(e.ts for e in res.events if e.kind == "model_call") == pytest.approx([0, 2])
    out = tmp_path / "x.jsonl"
    write_trace(res.events, out)
    again = read_trace(out)
    assert again.errors == [] and again.events == res.events


def test_absurd_token_counts_are_line_errors_not_a_memory_blowup(tmp_path):
    az = tmp_path / "az.csv"
    az.write_text(AZURE_HEADER + "2023-11-16 18:17:03.0000000,100000000000,1\n"
                  "2023-11-16 18:17:04.0000000,600,1\n")
    res = convert_azure(az)
    assert [e.line for e in res.errors] == [2] and "ContextTokens" in res.errors[0].reason
    tl = tmp_path / "tl.jsonl"
    tl.write_text(json.dumps({"session_id": "a", "input_tokens_total": 10**12,
                              "timing_events": [{"timestamp": "2026-06-01T05:40:20Z"}],
                              "tools": []}) + "\n")
    res = convert_tracelab(tl)
    assert [e.line for e in res.errors] == [1] and "input_tokens_total" in res.errors[0].reason


def test_a_byte_order_mark_does_not_cost_the_first_line(tmp_path):
    mc = tmp_path / "mc.jsonl"
    mc.write_text("\ufeff" + _mooncake_row(0, [0, 1]) + "\n", encoding="utf-8")
    assert convert_mooncake(mc).errors == []
    az = tmp_path / "az.csv"
    az.write_text("\ufeff" + AZURE_HEADER + "2023-11-16 18:17:03.0000000,600,1\n",
                  encoding="utf-8")
    res = convert_azure(az)
    assert res.errors == [] and len(res.events) == 2
    ak = tmp_path / "t.jsonl"
    ak.write_text("\ufeff" + CALL + "\n", encoding="utf-8")
    assert read_trace(ak).errors == []


def test_a_gzip_trace_reads_as_its_text(tmp_path):
    text = "\n".join(_mooncake_row(t, [0, 1, t]) for t in (0, 1000, 2000)) + "\n"
    plain, packed = tmp_path / "mc.jsonl", tmp_path / "mc.jsonl.gz"
    plain.write_text(text)
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        fh.write(text)
    a, b = convert_mooncake(plain), convert_mooncake(packed)
    assert b.errors == [] and b.events == a.events
    broken = tmp_path / "broken.gz"
    broken.write_bytes(packed.read_bytes()[:20])
    with pytest.raises(TraceFormatError, match="cannot read trace .*broken.gz"):
        convert_mooncake(broken)


def test_a_trace_without_any_kv_block_is_an_error_not_a_table_of_zeros():
    events = [TraceEvent(session="s", ts=0.0, kind="model_call", tokens=0, prefix_blocks=()),
              TraceEvent(session="s", ts=1.0, kind="model_call", tokens=0, prefix_blocks=())]
    with pytest.raises(TraceFormatError, match="no KV block to replay"):
        replay_workload(events, SimConfig(), "t")


def test_replay_refuses_an_infinite_idle_timeout():
    with pytest.raises(ValueError, match="finite"):
        ReplayConfig(idle_timeout_s=float("inf"))


def test_tracelab_rounds_missing_parts_say_what_is_missing(tmp_path):
    base = {"session_id": "a", "input_tokens_total": 600,
            "timing_events": [{"timestamp": "2026-06-01T05:40:20Z"}], "tools": []}
    path = tmp_path / "tl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        base,
        {**base, "tools": [{"tool_name": "Bash", "tool_wall_latency_ms": 5}]},
        {**base, "timing_events": ["user_message"]},
    ]) + "\n")
    res = convert_tracelab(path)
    assert [(e.line, e.reason) for e in res.errors] == [
        (2, "unusable round: a tool misses field 'emitted_at'"),
        (3, "unusable round: timing_events holds no event object")]


def test_an_integer_beyond_any_float_is_a_line_error(tmp_path):
    huge = "1" + "0" * 400
    res = parse_lines([f'{{"session": "s", "ts": {huge}, "kind": "task_end"}}'])
    assert [e.line for e in res.errors] == [1] and "finite" in res.errors[0].reason
    mc = tmp_path / "mc.jsonl"
    mc.write_text(f'{{"timestamp": {huge}, "input_length": 1, "hash_ids": [1]}}\n')
    assert [e.line for e in convert_mooncake(mc).errors] == [1]
    tl = tmp_path / "tl.jsonl"
    tl.write_text(json.dumps({"session_id": "a", "input_tokens_total": 600,
                              "timing_events": [{"timestamp": "2026-06-01T05:40:20Z"}],
                              "tools": [{"tool_name": "x", "emitted_at": "2026-06-01T05:40:20Z",
                                         "tool_wall_latency_ms": int(huge)}]}) + "\n")
    assert [e.line for e in convert_tracelab(tl).errors] == [1]


def test_a_tracelab_round_given_twice_is_reported_not_replayed_twice(tmp_path):
    def rnd(round_id, stamp, total, prefix):
        return json.dumps({"session_id": "a", "round_id": round_id, "round_index": 0,
                           "input_tokens_total": total, "prefix_tokens": prefix,
                           "timing_events": [{"timestamp": stamp}], "tools": []})

    first = rnd("m1", "2026-06-01T05:40:20Z", 1024, 0)
    second = rnd("m2", "2026-06-01T05:40:30Z", 1536, 1024)
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    once.write_text(first + "\n" + second + "\n")
    twice.write_text(f"{first}\n{first}\n{second}\n{second}\n")
    a, b = convert_tracelab(once), convert_tracelab(twice)
    assert [str(e) for e in b.errors] == [
        "line 2: unusable round: round 'm1' of session 'a' repeats line 1",
        "line 4: unusable round: round 'm2' of session 'a' repeats line 3"]
    assert b.events == a.events  # was: 4 calls and twice the blocks


def _tl_round(session, stamp, total, prefix, tools=()):
    return {"session_id": session, "input_tokens_total": total, "prefix_tokens": prefix,
            "timing_events": [{"timestamp": stamp}], "tools": list(tools)}


@pytest.mark.parametrize("tool, reason", [
    ({"tool_name": "Bash", "emitted_at": "2026-06-01T05:40:21Z"},
     "a tool misses field 'tool_wall_latency_ms'"),
    ({"tool_name": "Bash", "emitted_at": "2026-06-01T05:40:21Z", "tool_wall_latency_ms": None},
     "tool_wall_latency_ms must be a finite number"),
    ("Bash", "a tool is not a JSON object (str)"),
])
def test_a_tracelab_tool_without_a_usable_latency_rejects_its_round(tmp_path, tool, reason):
    path = tmp_path / "tl.jsonl"
    path.write_text(json.dumps(_tl_round("a", "2026-06-01T05:40:20Z", 600, 0)) + "\n"
                    + json.dumps(_tl_round("a", "2026-06-01T05:40:30Z", 1200, 512, [tool]))
                    + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [2]  # was: no error, the tool dropped silently
    assert reason in res.errors[0].reason
    assert [e.kind for e in res.events] == ["model_call"]


@pytest.mark.parametrize("session", ["", None, 7, ["a"]])
def test_a_tracelab_session_id_that_is_no_name_is_a_line_error(tmp_path, session):
    path = tmp_path / "tl.jsonl"
    path.write_text(json.dumps(_tl_round("a", "2026-06-01T05:40:20Z", 600, 0)) + "\n"
                    + json.dumps(_tl_round(session, "2026-06-01T05:40:30Z", 600, 0)) + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [2]  # was: "" accepted as a nameless session
    assert "session_id" in res.errors[0].reason
    assert {e.session for e in res.events} == {"a"}


def test_tracelab_sessions_never_share_block_ids(tmp_path):
    stamp = "2026-06-01T05:40:{:02d}Z"
    rows = [_tl_round("a", stamp.format(i), 100_000_000, 0) for i in range(6)]
    rows += [_tl_round("b", stamp.format(10 + i), 1024 + 512 * i, 1024 * i) for i in range(2)]
    path = tmp_path / "tl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = convert_tracelab(path)
    assert not res.errors
    blocks = {s: set() for s in "ab"}
    for e in res.events:
        blocks[e.session].update(e.prefix_blocks)
    assert len(blocks["a"]) > 1_000_000  # more than one session's former range
    assert blocks["a"].isdisjoint(blocks["b"])  # was: ids 1000000-1000003 in both
    b_calls = [e.prefix_blocks for e in res.events if e.session == "b"]
    assert b_calls[1][:2] == b_calls[0]  # within a session the prefix is kept
    out = tmp_path / "out.jsonl"
    write_trace(res.events, out)
    again = read_trace(out)
    assert again.errors == [] and again.events == res.events


def test_tracelab_block_ids_stay_where_they_were_without_an_overflow(tmp_path):
    rows = [_tl_round("a", "2026-06-01T05:40:20Z", 1024, 0),
            _tl_round("b", "2026-06-01T05:40:21Z", 1024, 0)]
    path = tmp_path / "tl.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    calls = {e.session: e.prefix_blocks for e in convert_tracelab(path).events}
    assert calls == {"a": (0, 1), "b": (1_000_000, 1_000_001)}


def _latin1(tmp_path, lines, packed=False):
    data = "".join(line + "\n" for line in lines).encode("latin-1")
    path = tmp_path / ("t.jsonl.gz" if packed else "t.jsonl")
    path.write_bytes(gzip.compress(data) if packed else data)
    return path


@pytest.mark.parametrize("packed", [False, True])
def test_a_line_that_is_not_utf8_is_a_line_error_not_a_merged_name(tmp_path, packed):
    call = ('{{"session": "{}", "ts": {}, "kind": "model_call", "tokens": 512, '
            '"prefix_blocks": [1]}}')
    path = _latin1(tmp_path, [call.format("a", 0), call.format("café", 1),
                              call.format("cafè", 2)], packed)
    res = read_trace(path)
    assert [e.line for e in res.errors] == [2, 3]  # was: both read as 'caf\ufffd'
    assert res.errors[0].reason == ("not UTF-8 text (byte 0xe9 at character 17); "
                                    "a trace must be UTF-8")
    assert [e.session for e in res.events] == ["a"]


def test_converters_report_lines_that_are_not_utf8(tmp_path):
    mc = _latin1(tmp_path, [_mooncake_row(0, [0, 1]), '{"timestamp": 5, "x": "é"}'])
    assert [e.line for e in convert_mooncake(mc).errors] == [2]
    az = tmp_path / "az.csv"
    az.write_bytes((AZURE_HEADER + "2023-11-16 18:17:03,10,1\n2023-11-16 18:17:04,1é,1\n")
                   .encode("latin-1"))
    errors = convert_azure(az).errors
    assert [e.line for e in errors] == [3] and "not UTF-8" in errors[0].reason
    tl = tmp_path / "tl.jsonl"
    tl.write_bytes((json.dumps(_tl_round("a", "2026-06-01T05:40:20Z", 600, 0)) + "\n"
                    + json.dumps(_tl_round("é", "2026-06-01T05:40:30Z", 600, 0),
                                 ensure_ascii=False) + "\n").encode("latin-1"))
    assert [e.line for e in convert_tracelab(tl).errors] == [2]


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "utf-32"])
def test_a_file_that_is_not_utf8_at_all_is_one_error(tmp_path, encoding):
    path = tmp_path / "t.jsonl"
    path.write_bytes('{"session": "café", "ts": 0, "kind": "task_end"}\n'.encode(encoding))
    with pytest.raises(TraceFormatError, match="not UTF-8"):
        read_trace(path)
