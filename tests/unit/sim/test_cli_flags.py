"""`agentkv simulate` refuses a flag the user gave in a mode where it has no effect,
and never prints a value the run does not use; defaults never trigger a refusal."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main

CALL = ('{{"session": "{s}", "ts": {ts}, "kind": "model_call", "tokens": 512, '
        '"prefix_blocks": [{b}]}}\n')


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(CALL.format(s="a", ts=0, b=1) + CALL.format(s="a", ts=1, b=1))
    return path


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "budget", "--budget", "0.5"],
     "--budget has no effect here: --sweep budget sets the budget of each point (0.2-0.7)"),
    (["--sweep", "budget", "--budget", "0.35"],  # the default's value, typed: still refused
     "--budget has no effect here"),
    (["--sweep", "noise", "--noise", "0.2"],
     "--noise has no effect here: --sweep noise sets the noise of each point (0.05-0.9)"),
    (["--sweep", "signal", "--signal-miss", "0.5"],
     "--signal-miss has no effect here: --sweep signal sets the signal loss"),
    (["--ablation", "--policies", "lru,agentkv"],
     "--policies has no effect here: --ablation runs AgentKV alone"),
    (["--ablation", "--no-fair"], "--no-fair has no effect here: --ablation runs no baseline"),
    (["--ablation", "--fair"], "--fair has no effect here"),
    (["--trace", "{trace}", "--workload", "agent-loop"],
     "--workload has no effect here: --trace replays the trace"),
    (["--trace", "{trace}", "--workload", "paper"], "--workload has no effect here"),
    (["--trace", "{trace}", "--batches", "7"], "--batches has no effect here"),
    (["--out-dir", "{dir}"], "--out-dir has no effect here: only --sweep writes figures"),
    (["--ablation", "--out-dir", "{dir}"], "--out-dir has no effect here"),
    (["--trace-format", "mooncake"],
     "--trace-format has no effect here: it names the format of --trace, not given"),
])
def test_a_flag_with_no_effect_in_its_mode_is_refused_in_one_line(
        tmp_path, trace, capsys, argv, message):
    out = tmp_path / "r.json"
    argv = [a.format(trace=trace, dir=tmp_path) for a in argv]
    assert main(["simulate", *argv, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "leave it out" in err and len(err.splitlines()) == 1
    assert not out.exists()  # refused before the run


@pytest.mark.parametrize("axis, shown, hidden", [
    ("budget", "budget=swept", "budget=0.35"),
    ("noise", "noise=swept", "noise=0.35"),
    ("signal", "miss swept", "miss 0 "),
])
def test_a_sweep_prints_its_axis_as_swept_not_as_the_unused_default(
        tmp_path, capsys, axis, shown, hidden):
    out = tmp_path / "r.json"
    assert main(["simulate", "--sweep", axis, "--batches", "1", "--policies", "lru",
                 "--no-fair", "--out-dir", str(tmp_path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert shown in printed and hidden not in printed  # was: budget=0.35 above a budget sweep
    assert json.loads(out.read_text())["sweep"]["axis"] == axis


def test_defaults_and_flags_that_apply_are_accepted_in_every_mode(tmp_path, trace):
    # every flag here has an effect in its mode: none may be refused
    assert main(["simulate", "--sweep", "noise", "--budget", "0.5", "--signal-miss", "0.1",
                 "--batches", "1", "--policies", "lru", "--no-fair",
                 "--out-dir", str(tmp_path)]) == 0
    assert main(["simulate", "--ablation", "--budget", "0.5", "--noise", "0.2",
                 "--workload", "paper", "--batches", "1"]) == 0
    assert main(["simulate", "--trace", str(trace), "--budget", "0.5", "--noise", "0.2",
                 "--policies", "lru", "--no-fair"]) == 0
