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
