"""Tasks in a trace: a reused session name, a task_end that ends nothing, and the
machine's time zone, which must not change a converted trace."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.trace.convert import convert_azure, convert_tracelab
from agentkv_cluster.sim.trace.format import TraceEvent, TraceFormatError, parse_lines
from agentkv_cluster.sim.trace.replay import (
    ReplayConfig,
    describe,
    replay_workload,
    sessions_of,
)
from agentkv_cluster.sim.trace.tasks import split_tasks


def _call(session: str, ts: float, blocks: list[int]) -> str:
    return json.dumps({"session": session, "ts": ts, "kind": "model_call",
                       "tokens": 512 * len(blocks), "prefix_blocks": blocks})


def _end(session: str, ts: float) -> str:
    return json.dumps({"session": session, "ts": ts, "kind": "task_end"})


# one name, two tasks: [0, 1] then [5, 6], each read once by its own second call
TWO_TASKS = [_call("s1", 1, [0, 1]), _call("s1", 3, [0, 1, 2]), _end("s1", 4),
             _call("s1", 11, [5, 6]), _call("s1", 13, [5, 6, 7]), _end("s1", 14)]


def test_a_task_end_before_its_sessions_model_calls_is_a_line_error_naming_line_and_session():
    res = parse_lines([_call("other", 0, [9]), _end("s1", 0.5),
                       _call("s1", 1, [1]), _call("s1", 4, [1, 2])])
    assert [str(e) for e in res.errors] == [
        ("line 2: task_end of session 's1' at ts 0.5 comes before the session's first "
         "model_call (ts 1.0)")]
    assert [e.kind for e in res.events] == ["model_call"] * 3  # the line is skipped
    (batch,) = replay_workload(res.events, SimConfig(), "t").batches
    assert np.all(batch.eol >= batch.created)  # s1 ends by its idle timeout, after its calls


def test_a_task_end_that_follows_an_ended_task_with_no_call_since_is_refused():
    res = parse_lines([*TWO_TASKS[:3], _end("s1", 4), _end("s1", 5), *TWO_TASKS[3:]])
    assert [e.line for e in res.errors] == [4, 5]  # a duplicated line, then a stray one
    assert str(res.errors[0]) == (
        "line 4: task_end of session 's1' at ts 4.0 ends no task: the session's previous "
        "task ended at ts 4.0 and its next model_call is at ts 11.0")
    assert len(res.events) == len(TWO_TASKS)


def test_file_order_does_not_matter_and_a_call_at_the_task_ends_instant_belongs_to_it():
    res = parse_lines([_end("s", 2), _call("s", 2, [1]), _call("s", 0, [1])])
    assert not res.errors
    assert [s.name for s in sessions_of(res.events)] == ["s"]


def test_a_session_name_reused_after_its_task_end_replays_as_two_sessions():
    res = parse_lines(TWO_TASKS)
    assert not res.errors
    tasks = sessions_of(res.events)
    assert [(s.name, s.task_end, len(s.calls)) for s in tasks] == [("s1", 4.0, 2),
                                                                  ("s1#2", 14.0, 2)]
    (batch,) = replay_workload(res.events, SimConfig(), "t").batches
    assert "2 sessions" in describe(replay_workload(res.events, SimConfig(), "t"))
    first = [i for i, s in enumerate(batch.sessions) if s == "s1"]
    second = [i for i, s in enumerate(batch.sessions) if s == "s1#2"]
    assert len(first) == len(second) == 3
    assert batch.eol[first].tolist() == [4.0] * 3  # each task's blocks end at its own end
    assert batch.eol[second].tolist() == [14.0] * 3
    only_first = replay_workload(res.events, SimConfig(), "t", ReplayConfig(sessions=1))
    assert set(only_first.batches[0].sessions) == {"s1"}


def test_a_session_that_only_reads_shared_blocks_is_counted():
    events = parse_lines([_call("a", 0, [1, 2]), _call("b", 1, [1, 2]),
                          _call("a", 2, [1, 2])]).events
    wl = replay_workload(events, SimConfig(), "t")
    assert set(wl.batches[0].sessions) == {"a"}  # b produces no block
    assert wl.sessions == 2 and "2 sessions" in describe(wl)  # was "1 sessions"


def test_a_later_task_gets_a_name_no_other_session_of_the_trace_has():
    events = parse_lines([*TWO_TASKS[:3], _call("s1#2", 2, [40]), *TWO_TASKS[3:]]).events
    names = [s.name for s in sessions_of(events)]
    assert sorted(names) == ["s1", "s1#2", "s1#2#"]
    assert split_tasks(events).tasks.count("s1#2#") == 3  # the reused name's second task


def test_replaying_events_with_a_task_end_that_ends_no_task_is_a_typed_error():
    events = [TraceEvent(session="s", ts=0.0, kind="task_end"),
              TraceEvent(session="s", ts=1.0, kind="model_call", tokens=512,
                         prefix_blocks=(1,))]
    with pytest.raises(TraceFormatError, match="'s' at ts 0.0 comes before"):
        replay_workload(events, SimConfig(), "t")


def test_cli_reports_the_refused_task_end_and_strict_mode_fails(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([_end("s1", 0), *TWO_TASKS]) + "\n")
    out = tmp_path / "r.json"
    assert main(["simulate", "--trace", str(trace), "--policies", "lru", "--no-fair",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [e["line"] for e in data["trace"]["malformed_lines"]] == [1]
    assert "2 sessions" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace), "--strict-trace"]) == 2
    assert "first: line 1: task_end of session 's1'" in capsys.readouterr().err


@pytest.fixture
def zone(monkeypatch):
    """Set the process's time zone (TZ + tzset); restored after the test."""
    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield set_zone
    monkeypatch.undo()
    time.tzset()


def _tracelab_row(session: str, stamp: str) -> str:
    return json.dumps({"session_id": session, "input_tokens_total": 1024, "prefix_tokens": 0,
                       "timing_events": [{"timestamp": stamp}], "tools": []})


@pytest.mark.parametrize("tz", ["America/New_York", "Asia/Kolkata"])
def test_tracelab_times_without_a_zone_are_utc_whatever_the_machines_zone(tmp_path, zone, tz):
    path = tmp_path / "tl.jsonl"  # one round stamped in UTC, one without a zone
    path.write_text(_tracelab_row("a", "2026-06-01T05:00:00Z") + "\n"
                    + _tracelab_row("b", "2026-06-01T05:10:00") + "\n")
    zone("UTC")
    utc = convert_tracelab(path)
    zone(tz)
    local = convert_tracelab(path)
    assert not utc.errors and not local.errors
    assert local.events == utc.events
    assert sorted(e.ts for e in utc.events) == [0.0, 600.0]


def test_azure_times_are_utc_across_a_daylight_saving_jump(tmp_path, zone):
    path = tmp_path / "az.csv"  # New York skips 02:00-03:00 local on this night
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-03-10 01:59:00.0000000,512,1\n2024-03-10 03:01:00.0000000,512,1\n")
    zone("UTC")
    utc = convert_azure(path)
    zone("America/New_York")
    local = convert_azure(path)
    assert local.events == utc.events
    assert max(e.ts for e in utc.events) == 3720.0  # 62 minutes, not 2
