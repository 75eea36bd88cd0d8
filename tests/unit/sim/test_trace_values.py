"""Source values the converters took silently or reported without naming the field.

A value that cannot be what its field says is a line error that names the field;
one the converter cannot tell from a good value never changes a result silently.
"""

from __future__ import annotations

import json

from agentkv_cluster.sim.trace.convert import convert_azure, convert_mooncake, convert_tracelab
from agentkv_cluster.sim.trace.format import read_trace, write_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _round(rid: str, ts: str, total: int, prefix: int = 0, tools=()) -> str:
    return json.dumps({"session_id": "s", "round_id": rid, "input_tokens_total": total,
                       "prefix_tokens": prefix, "tools": list(tools),
                       "timing_events": [{"event_type": "user_message", "timestamp": ts}]})


def test_tracelab_tool_latency_beyond_any_time_is_a_line_error(tmp_path):
    # 1e300 ms was taken as a tool of 1e297 s: a result printed, and --export-trace
    # wrote a trace that does not reload (its tool_duration_s is above MAX_SECONDS).
    tool = {"tool_name": "bash", "emitted_at": "2026-06-01T05:40:21Z",
            "tool_wall_latency_ms": 1e300}
    path = tmp_path / "tl.jsonl"
    path.write_text(_round("r0", "2026-06-01T05:40:20Z", 2000, tools=[tool]) + "\n"
                    + _round("r1", "2026-06-01T05:40:25Z", 3000, 2000) + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [1]
    assert "tool_wall_latency_ms" in res.errors[0].reason
    assert all(e.tool_duration_s <= 1e12 for e in res.events)
    write_trace(res.events, tmp_path / "out.jsonl")
    assert read_trace(tmp_path / "out.jsonl").errors == []


def test_azure_fraction_of_a_second_is_digits_only(tmp_path):
    # float("0." + "1e5") is 10,000: the row was placed 2.8 hours later, silently.
    path = tmp_path / "az.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 18:17:03.5,100,1\n"
                    "2023-11-16 18:17:04.1e5,100,1\n"
                    "2023-11-16 18:17:04.-5,100,1\n")
    res = convert_azure(path)
    assert [e.line for e in res.errors] == [3, 4]
    assert all("TIMESTAMP" in e.reason and "digits" in e.reason for e in res.errors)
    assert max(e.ts for e in res.events) == 0.0


def test_azure_errors_name_the_column(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(AZURE_HEADER + "2023-11-16 18:17:03.5,100,1\n"
                    "nan,1,1\n"
                    "2023-11-16 18:17:04.0,1e12,1\n"
                    "2023-11-16 18:17:04.0,5,inf\n"
                    "2023-11-16 18:17:04.0,5,-1\n")
    reasons = [e.reason for e in convert_azure(path).errors]
    assert reasons[0].startswith("TIMESTAMP 'nan'")
    assert reasons[1] == "ContextTokens must be an integer, got '1e12'"
    assert reasons[2] == "GeneratedTokens must be an integer, got 'inf'"
    assert reasons[3] == "GeneratedTokens must be >= 0, got -1"


def test_mooncake_integer_timestamp_beyond_any_float_names_the_field(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 9, "hash_ids": [1]}) + "\n"
                    + '{"timestamp": 1' + "0" * 400 + ', "input_length": 9, "hash_ids": [1]}\n')
    res = convert_mooncake(path)
    assert [e.line for e in res.errors] == [2]
    assert res.errors[0].reason.startswith("timestamp must be <=")


def test_tracelab_prefix_above_the_whole_input_is_a_line_error(tmp_path):
    # A 100-token round that "keeps" 1e15 cached tokens was replayed as a context of
    # every block its session had so far: more KV than the round's whole input.
    path = tmp_path / "tl.jsonl"
    path.write_text(_round("r0", "2026-06-01T05:40:20Z", 5000) + "\n"
                    + _round("r1", "2026-06-01T05:40:25Z", 100, 10**15) + "\n")
    res = convert_tracelab(path)
    assert [e.line for e in res.errors] == [2]
    assert res.errors[0].reason == ("unusable round: prefix_tokens 1000000000000000 "
                                    "exceeds input_tokens_total 100")
