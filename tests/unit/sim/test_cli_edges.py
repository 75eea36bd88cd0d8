"""`agentkv simulate` at the edges of its options and of its figures."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.sim.metrics import PolicyMetrics
from agentkv_cluster.sim.report import margins_vs_lru

CALL = ('{{"session": "{s}", "ts": {ts}, "kind": "model_call", "tokens": 512, '
        '"prefix_blocks": [{b}]}}\n')


def _metrics(p95: float, reads: int = 10) -> PolicyMetrics:
    return PolicyMetrics(p50_ms=0.0, p95_ms=p95, p99_ms=p95, byte_hit_pct=50.0,
                         transfer_mb_per_batch=1.0, hidden_pct=0.0, risk_pct=0.0,
                         wrong_eviction_pct=0.0, demoted_mb_per_batch=0.0,
                         wasted_prefetch_mb_per_batch=0.0, reads=reads, overflow_events=0)


def test_a_change_against_a_zero_lru_figure_is_not_reported_as_no_change():
    m = margins_vs_lru({"lru": _metrics(0.0), "agentkv": _metrics(4.5)})
    assert m["p95_change_pct"] is None  # was 0.0: "AgentKV equals LRU" while 4.5 ms worse
    assert margins_vs_lru({"lru": _metrics(0.0), "agentkv": _metrics(0.0)})[
        "p95_change_pct"] == 0.0


def test_a_replay_without_a_single_read_states_no_margin(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"  # two sessions, no block read twice
    trace.write_text(CALL.format(s="a", ts=0, b=1) + CALL.format(s="b", ts=1, b=2))
    out = tmp_path / "r.json"
    assert main(["simulate", "--trace", str(trace), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["policies"]["agentkv"]["reads"] == 0
    assert data["agentkv_vs_strongest"] is None and "agentkv_vs_lru" not in data
    text = capsys.readouterr().out
    assert "0 reads" in text and "+0.0 %" not in text


@pytest.mark.parametrize("argv, message", [
    (["--idle-timeout", "inf"], "--idle-timeout must be a finite number > 0"),
    (["--idle-timeout", "nan"], "--idle-timeout must be a finite number > 0"),
])
def test_an_infinite_idle_timeout_is_refused_before_the_run(tmp_path, argv, message, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(CALL.format(s="a", ts=0, b=1) + CALL.format(s="a", ts=1, b=1))
    assert main(["simulate", "--trace", str(trace), "--json", str(tmp_path / "r.json"),
                 *argv]) == 2
    assert message in capsys.readouterr().err


def test_trace_skip_without_a_trace_is_refused(capsys):
    assert main(["simulate", "--batches", "2", "--trace-skip", "3"]) == 2
    assert "--trace-skip need --trace" in capsys.readouterr().err


def test_output_that_fails_at_the_end_is_a_clean_error(tmp_path, monkeypatch, capsys):
    from agentkv_cluster.sim import report

    def refuse(payload, path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(report, "write_json", refuse)
    assert main(["simulate", "--batches", "2", "--policies", "lru", "--no-fair",
                 "--json", str(tmp_path / "r.json")]) == 2
    assert "cannot write: Permission denied" in capsys.readouterr().err


def test_a_sweep_that_cannot_draw_its_figure_says_so(tmp_path, capsys):
    assert main(["simulate", "--sweep", "noise", "--batches", "2", "--policies", "lru",
                 "--no-fair", "--out-dir", str(tmp_path)]) == 0
    assert "no noise figure" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))


def test_a_policy_named_twice_is_refused_before_the_run(capsys):
    from agentkv_cluster.sim.config import SimConfig, WorkloadConfig
    from agentkv_cluster.sim.runner import DuplicatePolicy, compare

    assert main(["simulate", "--batches", "2", "--policies", "lru,ttl,lru"]) == 2
    err = capsys.readouterr().err
    assert "--policies: policy lru given more than once" in err
    with pytest.raises(DuplicatePolicy, match="agentkv given more than once"):
        compare(SimConfig(workload=WorkloadConfig(batches=1)),
                policies=("agentkv", "lru", "agentkv"))


def test_a_trace_in_another_format_says_to_check_the_format(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,1\n")
    assert main(["simulate", "--trace", str(trace), "--trace-format", "mooncake"]) == 2
    err = capsys.readouterr().err
    assert "none of its lines is a valid mooncake record (2 malformed; first: line 1" in err
    assert "is --trace-format mooncake the file's format?" in err


def test_an_empty_policy_list_says_so(capsys):
    assert main(["simulate", "--batches", "2", "--policies", " , "]) == 2
    assert "--policies names no policy" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [["--ablation"], ["--sweep", "noise", "--no-fair",
                                                   "--policies", "lru,agentkv"]])
def test_an_ablation_or_sweep_without_a_single_read_says_it_measured_nothing(
        tmp_path, capsys, mode):
    trace = tmp_path / "t.jsonl"  # two sessions, no block read twice
    trace.write_text(CALL.format(s="a", ts=0, b=1) + CALL.format(s="b", ts=1, b=2))
    figures = ["--out-dir", str(tmp_path)] if mode[0] == "--sweep" else []
    assert main(["simulate", "--trace", str(trace), *figures, *mode]) == 0
    assert "0 reads" in capsys.readouterr().out  # was: a table of 1.00 ratios, no word


@pytest.mark.parametrize("flags, message", [
    (["--json", "{trace}"], "--json {trace} is the trace being read"),
    (["--export-trace", "{link}"], "--export-trace {link} is the trace being read"),
    (["--json", "{out}", "--export-trace", "{out}"],
     "--json and --export-trace name the same file"),
])
def test_an_output_that_would_overwrite_the_trace_is_refused(tmp_path, capsys, flags, message):
    trace, link, out = tmp_path / "t.jsonl", tmp_path / "link.jsonl", tmp_path / "o.json"
    text = CALL.format(s="a", ts=0, b=1) + CALL.format(s="a", ts=1, b=1)
    trace.write_text(text)
    link.symlink_to(trace)
    names = {"trace": trace, "link": link, "out": out}
    assert main(["simulate", "--trace", str(trace),
                 *[f.format(**names) for f in flags]]) == 2
    assert message.format(**names) in capsys.readouterr().err
    assert trace.read_text() == text and not out.exists()  # was: the trace overwritten
