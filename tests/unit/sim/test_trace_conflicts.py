"""Trace lines that contradict an earlier line: a tool_start given twice, one block id
given two sizes. Each is a line error naming the line, the session and the block."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.trace.format import TraceEvent, TraceFormatError, parse_lines
from agentkv_cluster.sim.trace.replay import replay_workload, sessions_of


def _call(session: str, ts: float, blocks: list[int], block_tokens: int | None = None) -> str:
    d = {"session": session, "ts": ts, "kind": "model_call", "tokens": 512 * len(blocks),
         "prefix_blocks": blocks}
    if block_tokens is not None:
        d["block_tokens"] = block_tokens
    return json.dumps(d)


def _tool(session: str, ts: float, seconds: float, tool: str = "search") -> str:
    return json.dumps({"session": session, "ts": ts, "kind": "tool_start",
                       "tool_class": tool, "tool_duration_s": seconds})


DUPLICATED_TOOL = [_call("s1", 0, [1]), _tool("s1", 0.5, 2.0), _tool("s1", 0.5, 2.0),
                   _call("s1", 10, [1, 2])]


def test_a_duplicated_tool_start_line_is_a_line_error_and_counts_once():
    res = parse_lines(DUPLICATED_TOOL)
    assert [e.line for e in res.errors] == [3]
    reason = res.errors[0].reason
    assert "tool_start of session 's1' at ts 0.5" in reason and "repeats line 2" in reason
    (session,) = sessions_of(res.events)
    assert session.tool_before(10.0) == ("search", 2.0)  # was 4.0: the duration twice


def test_a_repeated_zero_second_tool_start_adds_nothing_and_is_kept():
    # the Mooncake converter gives two requests in one millisecond a 0-s think each
    res = parse_lines([_call("c", 0, [1]), _tool("c", 0, 0.0, "think"),
                       _call("c", 0, [1]), _tool("c", 0, 0.0, "think")])
    assert res.errors == [] and len(res.events) == 4


def test_tools_that_differ_in_time_class_or_duration_are_not_duplicates():
    res = parse_lines([_call("s1", 0, [1]), _tool("s1", 0.5, 2.0), _tool("s1", 0.5, 3.0),
                       _tool("s1", 0.5, 2.0, "bash"), _tool("s1", 0.6, 2.0),
                       _tool("s2", 0.5, 2.0), _call("s2", 0, [3])])
    assert res.errors == []


def test_one_block_given_two_sizes_is_a_line_error_naming_line_session_and_block():
    res = parse_lines([_call("s1", 0, [7, 8], block_tokens=256), _call("s2", 1, [9]),
                       _call("s2", 2, [9, 7]), _call("s1", 3, [7, 8], block_tokens=256)])
    assert [e.line for e in res.errors] == [3]
    reason = res.errors[0].reason
    assert ("model_call of session 's2' at ts 2.0 gives block 7 block_tokens 512, but line 1 "
            "(session 's1') gave it 256") in reason
    assert [e.ts for e in res.events] == [0, 1, 3]  # the earlier size is kept, not mixed


def test_replaying_events_that_contradict_each_other_is_refused():
    events = [TraceEvent(session="s", ts=0.0, kind="model_call", tokens=256,
                         prefix_blocks=(1,), block_tokens=256),
              TraceEvent(session="s", ts=1.0, kind="model_call", tokens=512,
                         prefix_blocks=(1,))]
    with pytest.raises(TraceFormatError, match="event 2: model_call of session 's' at ts "
                                               "1.0 gives block 1 block_tokens 512"):
        replay_workload(events, SimConfig(), source="hand-built")


def test_the_cli_reports_a_duplicated_line_and_strict_mode_refuses_it(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(DUPLICATED_TOOL) + "\n")
    out = tmp_path / "r.json"
    assert main(["simulate", "--trace", str(trace), "--policies", "lru", "--no-fair",
                 "--json", str(out)]) == 0
    assert [e["line"] for e in json.loads(out.read_text())["trace"]["malformed_lines"]] == [3]
    capsys.readouterr()
    assert main(["simulate", "--trace", str(trace), "--strict-trace"]) == 2
    assert "first: line 3: tool_start of session 's1'" in capsys.readouterr().err
