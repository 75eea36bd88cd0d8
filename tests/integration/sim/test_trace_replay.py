"""Replays of the real public traces in ../shared/traces (skipped where absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.policies import POLICY_NAMES
from agentkv_cluster.sim.report import dumps
from agentkv_cluster.sim.runner import compare
from agentkv_cluster.sim.trace.convert import load_trace
from agentkv_cluster.sim.trace.format import read_trace, write_trace
from agentkv_cluster.sim.trace.replay import replay_workload

pytestmark = pytest.mark.integration

REPLAY_EVENTS = 1500


def _trace(traces_dir: Path, name: str) -> Path:
    path = traces_dir / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


def test_mooncake_conversation_trace_replays_end_to_end_for_every_policy(traces_dir):
    path = _trace(traces_dir, "mooncake_fast25_conversation_trace.jsonl")
    parsed = load_trace(path, "mooncake")
    assert parsed.errors == [] and parsed.lines == 12031
    assert sum(e.kind == "model_call" for e in parsed.events) == 12031
    cfg = SimConfig()
    result = compare(cfg, workload=replay_workload(parsed.events, cfg, path.name))
    assert set(result.policies) == set(POLICY_NAMES)
    reads = {m.reads for m in result.policies.values()}
    assert len(reads) == 1 and reads.pop() > 50_000  # every policy sees the same reads
    lru, agentkv = result.policies["lru"], result.policies["agentkv"]
    assert lru.hidden_pct == 0.0 and agentkv.hidden_pct > 0.0
    assert agentkv.transfer_mb_per_batch < lru.transfer_mb_per_batch
    assert agentkv.p95_ms < lru.p95_ms
    assert "NaN" not in dumps(result.to_dict())


@pytest.mark.parametrize("name, fmt", [
    ("mooncake_fast25_synthetic_trace.jsonl", "mooncake"),
    ("tracelab_example_sanitized_round_trace.jsonl", "tracelab"),
    ("azure_llm_2023_code.csv", "azure"),
])
def test_other_traces_convert_without_losing_lines_and_replay(traces_dir, tmp_path, name, fmt):
    path = _trace(traces_dir, name)
    parsed = load_trace(path, fmt)
    assert parsed.errors == []
    # The converted trace survives a round trip through the documented format.
    out = tmp_path / "converted.jsonl"
    write_trace(parsed.events, out)
    again = read_trace(out)
    assert again.errors == [] and len(again.events) == len(parsed.events)
    # Conversion and the round trip cover every line; the replay smoke check covers
    # the first REPLAY_EVENTS (the full replay is the Mooncake conversation test's).
    cfg = SimConfig()
    result = compare(cfg, workload=replay_workload(again.events[:REPLAY_EVENTS], cfg, name),
                     policies=("lru", "agentkv"))
    assert result.policies["lru"].reads == result.policies["agentkv"].reads
    if fmt == "azure":  # no prefix or session information: nothing is ever reused
        assert result.policies["lru"].reads == 0
    else:
        assert result.policies["lru"].reads > 0
