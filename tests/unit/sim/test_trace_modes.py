"""``--sweep`` and ``--ablation`` on a trace: the config they print and save is the
trace's (one timeline, one batch), not the synthetic default they never used."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.cli import main


@pytest.mark.parametrize("mode", [("--ablation",),
                                  ("--sweep", "noise", "--policies", "lru", "--out-dir")])
def test_a_trace_mode_saves_the_trace_batch_count(tmp_path, capsys, mode):
    trace = tmp_path / "mc.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 600,
                                         "hash_ids": list(range(i + 1))}) + "\n"
                             for i in range(4)))
    out = tmp_path / "r.json"
    argv = ["simulate", "--trace", str(trace), "--trace-format", "mooncake",
            "--json", str(out), *mode]
    if mode[-1] == "--out-dir":
        argv.append(str(tmp_path))
    assert main(argv) == 0
    assert json.loads(out.read_text())["config"]["workload"]["batches"] == 1
    assert "batches=1 from the trace" in capsys.readouterr().out
