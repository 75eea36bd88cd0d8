"""Long work shows progress: reading a trace and replaying its one long batch.

A trace replay is ONE batch, so progress counted in batches said nothing until the
end (a million-request trace: minutes of silence); it is counted in pages, within
the batch. Reading reports the lines read so far.
"""

from __future__ import annotations

import io
import json

from rich.console import Console

from agentkv_cluster.cli._simulate_trace import reading_progress
from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.sim import engine
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import BatchRun
from agentkv_cluster.sim.runner import compare, pages, runs_per_comparison
from agentkv_cluster.sim.trace import format as trace_format
from agentkv_cluster.sim.trace.convert import load_trace
from agentkv_cluster.sim.trace.replay import replay_workload
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()


def _mooncake(path, rows: int) -> None:
    path.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 600,
                                        "hash_ids": list(range(i + 1))}) + "\n"
                            for i in range(rows)))


def test_a_batch_reports_its_pages_as_it_goes(monkeypatch):
    monkeypatch.setattr(engine, "PROGRESS_PAGES", 2)
    batch = make_batch(sizes_mb=[10] * 5, created=[0.0, 1.0, 2.0, 3.0, 4.0],
                       reads=[[5.0], [], [], [], []], capacity_mb=100)
    told: list[int] = []
    BatchRun(batch, FullPrecisionDriver(LruPolicy(), CFG)).run(told.append)
    assert told == [2, 2, 1]


def test_a_replay_reports_pages_within_its_one_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "PROGRESS_PAGES", 3)
    path = tmp_path / "mc.jsonl"
    _mooncake(path, 6)
    workload = replay_workload(load_trace(path, "mooncake").events, CFG, source="t")
    assert len(workload) == 1 and pages(workload) == 6
    told: list[int] = []
    compare(CFG, workload=workload, policies=("lru", "agentkv"), fair=True,
            progress=told.append)
    assert sum(told) == pages(workload) * runs_per_comparison(("lru", "agentkv"), True)
    assert len(told) > runs_per_comparison(("lru", "agentkv"), True)  # not one per batch


def test_reading_reports_the_lines_read(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_format, "PROGRESS_LINES", 2)
    path = tmp_path / "mc.jsonl"
    _mooncake(path, 5)
    for fmt in ("mooncake", "agentkv"):
        told: list[int] = []
        load_trace(path, fmt, progress=told.append)
        assert told == [2, 2, 1]


def test_reading_progress_in_a_log_prints_plain_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=150)
    with reading_progress(console, "reading t.jsonl", every_s=0.0) as advance:
        advance(65_536)
        advance(10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("reading t.jsonl: 65,536 lines after ")
    assert lines[-1].startswith("reading t.jsonl: 65,546 lines in ")


def test_a_logged_replay_counts_pages_and_says_what_it_builds(tmp_path, capsys):
    from agentkv_cluster.cli import main

    path = tmp_path / "mc.jsonl"
    _mooncake(path, 6)
    assert main(["simulate", "--trace", str(path), "--trace-format", "mooncake",
                 "--policies", "lru", "--no-fair"]) == 0
    captured = capsys.readouterr()
    assert "building the timeline of 12 events" in captured.out
    assert "replaying: 6/6 (100%)" in captured.err  # pages, not the one batch
