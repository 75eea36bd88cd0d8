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
