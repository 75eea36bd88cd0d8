"""`agentkv simulate`: a sweep without a baseline, a trace's facts in every JSON, and a
``--batches`` no machine can hold."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main

CALL = ('{{"session": "{s}", "ts": {ts}, "kind": "model_call", "tokens": 512, '
        '"prefix_blocks": [{b}]}}\n')


def _trace(tmp_path):
    """Session a reads its block again; line 3 is malformed."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(CALL.format(s="a", ts=0, b=1) + CALL.format(s="a", ts=1, b=1)
                     + '{"session": "a", "ts": 2, "kind": "model_call", "tokens": -5, '
                       '"prefix_blocks": [1]}\n')
    return trace


def test_a_signal_sweep_of_agentkv_alone_draws_it_alone(tmp_path, capsys):
    figures, out = tmp_path / "figs", tmp_path / "s.json"
    assert main(["simulate", "--sweep", "signal", "--policies", "agentkv", "--batches", "2",
                 "--out-dir", str(figures), "--json", str(out)]) == 0  # was: a TypeError
    assert "draws agentkv alone" in capsys.readouterr().out
    assert (figures / "fig_signal_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep = json.loads(out.read_text())["sweep"]
    assert [p["margins"] for p in sweep["agentkv_vs_strongest"]] == [None] * 6
    assert all(set(p["policies"]) == {"agentkv"} for p in sweep["points"])


@pytest.mark.parametrize("mode", [
    ["--ablation"],
    ["--sweep", "budget", "--policies", "lru", "--no-fair"],
    ["--policies", "lru", "--no-fair"],
])
def test_every_mode_saves_the_trace_and_its_malformed_lines(tmp_path, mode):
    trace, out = _trace(tmp_path), tmp_path / "r.json"
    figures = ["--out-dir", str(tmp_path)] if "--sweep" in mode else []
    assert main(["simulate", "--trace", str(trace), "--trace-skip", "0",
                 "--idle-timeout", "60", "--json", str(out), *figures, *mode]) == 0
    info = json.loads(out.read_text())["trace"]  # was: no "trace" with --sweep / --ablation
    assert info["file"] == str(trace) and info["format"] == "agentkv"
    assert info["lines"] == 3 and info["events"] == 2
    assert info["idle_timeout_s"] == 60.0 and info["skip"] == 0 and info["sessions"] is None
    assert [m["line"] for m in info["malformed_lines"]] == [3]


def test_a_synthetic_run_keeps_no_trace_section(tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--batches", "2", "--policies", "lru", "--no-fair",
                 "--json", str(out)]) == 0
    assert "trace" not in json.loads(out.read_text())


def test_batches_beyond_the_machine_are_one_error_line(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "--batches", "10000000000000", "--policies", "lru",
                 "--no-fair", "--json", str(out)]) == 2
    err = capsys.readouterr().err  # was: a numpy MemoryError traceback (exit 1)
    assert err.count("\n") == 1
    assert "--batches 10,000,000,000,000 needs at least" in err and "use fewer" in err
    assert not out.exists()


def test_agent_loops_beyond_the_machine_are_refused_before_the_run(monkeypatch, capsys):
    # A machine of 10 kB: 50 agent-loop batches (kilobytes each) do not fit. (Without the
    # check, --batches 10**13 would build agent loops until the memory ran out.)
    monkeypatch.setattr("agentkv_cluster.cli._simulate_args._physical_memory",
                        lambda: 10_000, raising=False)
    assert main(["simulate", "--batches", "50", "--workload", "agent-loop", "--policies",
                 "lru", "--no-fair"]) == 2
    assert "--batches 50 needs at least" in capsys.readouterr().err


def test_running_out_of_memory_anyway_is_one_error_line(monkeypatch, capsys):
    from agentkv_cluster.sim import runner

    def exhausted(cfg):
        raise MemoryError

    monkeypatch.setattr(runner, "make_workload", exhausted)
    monkeypatch.setattr("agentkv_cluster.cli.simulate.check_workload_memory",
                        lambda cfg: None, raising=False)
    assert main(["simulate", "--batches", "2", "--policies", "lru", "--no-fair"]) == 2
    assert "out of memory" in capsys.readouterr().err
