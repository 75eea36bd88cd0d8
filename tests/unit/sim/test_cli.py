"""`agentkv simulate` end to end on small runs: JSON shape, determinism, errors."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main

POLICIES = {"lru", "ttl", "semantic", "agentkv", "arc"}
KEYS = {"p50_ms", "p95_ms", "p99_ms", "byte_hit_pct", "transfer_mb_per_batch", "hidden_pct",
        "risk_pct"}


def test_compare_writes_the_documented_json(tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--batches", "40", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == POLICIES
    for metrics in data["policies"].values():
        assert KEYS <= set(metrics)
    assert data["config"]["budget"] == 0.35 and data["config"]["noise"] == 0.35
    assert data["config"]["workload"]["batches"] == 40
    assert data["policies"]["lru"]["hidden_pct"] == 0.0
    assert set(data["agentkv_vs_lru"]) == {"p95_change_pct", "p99_change_pct",
                                           "transfer_change_pct", "hidden_pct"}
    # the baselines given the same signals sit beside the paper-faithful ones
    assert set(data["fair_policies"]) == POLICIES
    assert data["fair_policies"]["agentkv"] == data["policies"]["agentkv"]
    assert data["fair_policies"]["lru"]["retired_pages_per_batch"] > 0
    assert data["policies"]["lru"]["retired_pages_per_batch"] == 0
    strongest = data["agentkv_vs_strongest"]
    assert set(strongest) == {"p95_ms", "p99_ms", "transfer_mb_per_batch"}
    assert data["config"]["signals"] == {"miss": 0.0, "delay_s": 0.0, "false_rate": 0.0}


def test_no_fair_drops_the_fair_tables_and_signal_flags_reach_the_config(tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--batches", "20", "--no-fair", "--signal-miss", "0.5",
                 "--signal-delay", "2", "--signal-false", "0.1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "fair_policies" not in data
    assert data["config"]["signals"] == {"miss": 0.5, "delay_s": 2.0, "false_rate": 0.1}
    assert data["policies"]["agentkv"]["false_signal_reads"] > 0  # AgentKV acts on signals
    assert data["policies"]["lru"]["false_signal_reads"] == 0  # the paper's LRU does not


def test_signal_sweep_writes_the_signal_quality_figure(tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["simulate", "--sweep", "signal", "--batches", "8", "--policies",
                 "lru,agentkv", "--out-dir", str(tmp_path), "--json", str(out)]) == 0
    sweep = json.loads(out.read_text())["sweep"]
    assert [p["value"] for p in sweep["points"]] == [0.0, 0.1, 0.25, 0.5, 0.75, 0.9]
    assert len(sweep["fair_points"]) == 6
    assert sweep["agentkv_vs_strongest"][0]["margins"]["p95_ms"]["strongest"] in (
        "lru", "fair:lru")
    assert (tmp_path / "fig_signal_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_agent_loop_preset_runs(tmp_path):
    out = tmp_path / "r.json"
    assert main(["simulate", "--workload", "agent-loop", "--batches", "5", "--json",
                 str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["workload"]["preset"] == "agent-loop"
    assert data["policies"]["lru"]["reads"] > 5 * 20  # whole-context re-reads


def test_fixed_seed_gives_bit_identical_json_and_another_seed_does_not(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    for path, seed in ((a, "3"), (b, "3"), (c, "4")):
        assert main(["simulate", "--batches", "30", "--seed", seed, "--json", str(path)]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_ablation_json_is_normalised_to_full(tmp_path):
    out = tmp_path / "abl.json"
    assert main(["simulate", "--ablation", "--batches", "30", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["ablation"]
    assert set(rows) == {"full", "no_gap_prefetch", "no_reversible_compression",
                         "no_event_dependency", "no_risk_control", "fixed_precision"}
    assert rows["full"]["normalized"] == {"p95_ms": 1.0, "transfer_mb_per_batch": 1.0,
                                          "wrong_eviction_pct": 1.0}


def test_noise_sweep_writes_figure_7(tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["simulate", "--sweep", "noise", "--batches", "10", "--policies", "agentkv",
                 "--out-dir", str(tmp_path), "--json", str(out)]) == 0
    points = json.loads(out.read_text())["sweep"]["points"]
    assert [p["value"] for p in points] == [0.05, 0.10, 0.20, 0.35, 0.50, 0.70, 0.90]
    assert (tmp_path / "fig7_noise.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0"], "budget must be in (0, 1]"),
    (["--policies", "lru,mru"], "unknown policy mru"),
    (["--strict-trace"], "need --trace"),
    (["--signal-miss", "1.5"], "signal miss must be in [0, 1]"),
    (["--signal-delay", "-1"], "signal delay must be a finite number >= 0"),
    (["--idle-timeout", "5"], "need --trace"),
])
def test_bad_arguments_exit_2_with_a_clear_message(argv, message, capsys):
    assert main(["simulate", "--batches", "5", *argv]) == 2
    assert message in capsys.readouterr().err


def test_trace_replay_reports_malformed_lines_and_strict_mode_fails(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"session": "s", "ts": 0, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]}\n'
        '{"session": "s", "ts": 1, "kind": "nap"}\n'
        '{"session": "s", "ts": 2, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]}\n')
    out = tmp_path / "r.json"
    assert main(["simulate", "--trace", str(trace), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["trace"]["malformed_lines"] == [
        {"line": 2, "reason": "unknown event kind 'nap' (expected one of model_call, "
                              "tool_start, observation_return, task_end)"}]
    assert data["policies"]["lru"]["reads"] == 1
    assert data["config"]["workload"]["batches"] == data["workload"]["batches"] == 1
    assert "line 2: unknown event kind" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace), "--strict-trace"]) == 2
    assert "1 malformed line(s); first: line 2" in capsys.readouterr().err


def test_missing_trace_file_is_a_clean_error(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read trace" in capsys.readouterr().err


TRACE = (
    '{"session": "s", "ts": 0, "kind": "model_call", "tokens": 1024, "prefix_blocks": [1, 2]}\n'
    '{"session": "s", "ts": 0.5, "kind": "tool_start", "tool_class": "bash", '
    '"tool_duration_s": 1.5}\n'
    '{"session": "s", "ts": 2, "kind": "model_call", "tokens": 1536, "prefix_blocks": [1, 2, 3]}\n'
    '{"session": "t", "ts": 2, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]}\n'
    '{"session": "s", "ts": 2.5, "kind": "tool_start", "tool_class": "bash", '
    '"tool_duration_s": -1}\n'
    '{"session": "s", "ts": 4, "kind": "model_call", "tokens": 1536, "prefix_blocks": [1, 2, 3]}\n'
)


@pytest.mark.parametrize("mode", [["--ablation"], ["--sweep", "budget"]])
def test_ablation_and_sweep_work_with_a_trace(tmp_path, mode):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out = tmp_path / "r.json"
    figures = ["--out-dir", str(tmp_path)] if mode[0] == "--sweep" else []
    assert main(["simulate", "--trace", str(trace), *mode, *figures,
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert ("ablation" in data) if mode[0] == "--ablation" else ("sweep" in data)


def test_trace_export_always_reloads_and_bad_values_name_their_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    out, exported = tmp_path / "r.json", tmp_path / "x.jsonl"
    assert main(["simulate", "--trace", str(trace), "--export-trace", str(exported),
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [e["line"] for e in data["trace"]["malformed_lines"]] == [5]  # negative duration
    assert "reloads cleanly" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(exported), "--strict-trace"]) == 0
    # same-time reads by two sessions are both counted: block 1 read at 2 (s, t) and 4
    assert data["policies"]["lru"]["reads"] == 2 + 1 + 3
