"""Replays of the real public traces in ../shared/traces (skipped where absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.policies import POLICY_NAMES
from agentkv_cluster.sim.report import dumps
from agentkv_cluster.sim.runner import compare
from agentkv_cluster.sim.trace.convert import load_trace
from agentkv_cluster.sim.trace.format import read_trace, write_trace
from agentkv_cluster.sim.trace.replay import ReplayConfig, replay_workload, sessions_of

pytestmark = pytest.mark.integration

SAMPLE_SESSIONS = 150  # whole sessions, first by start time: the replay of one timeline


def _trace(traces_dir: Path, name: str) -> Path:
    path = traces_dir / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


def test_mooncake_conversation_trace_replays_as_one_timeline_for_every_policy(traces_dir):
    path = _trace(traces_dir, "mooncake_fast25_conversation_trace.jsonl")
    parsed = load_trace(path, "mooncake")
    assert parsed.errors == [] and parsed.lines == 12031
    assert sum(e.kind == "model_call" for e in parsed.events) == 12031
    assert not [e for e in parsed.events if e.kind == "task_end"]  # never invented
    cfg = SimConfig()
    wl = replay_workload(parsed.events, cfg, path.name, ReplayConfig(sessions=SAMPLE_SESSIONS))
    (batch,) = wl.batches  # every sampled session shares one budget and one link
    assert len(set(batch.sessions)) == SAMPLE_SESSIONS
    # a block's signal is never before the idle timeout after its production
    assert (batch.eol >= batch.created + ReplayConfig().idle_timeout_s).all()
    result = compare(cfg, workload=wl, fair=True)
    assert set(result.policies) == set(POLICY_NAMES) == set(result.fair_policies)
    reads = {m.reads for m in (*result.policies.values(), *result.fair_policies.values())}
    assert len(reads) == 1 and reads.pop() > 1000  # every policy sees the same reads
    assert result.policies["lru"].hidden_pct == 0.0
    # conversations that just stop are declared over only after the idle timeout: the
    # cost-aware prefetch rule learns that a silent conversation rarely comes back and
    # wastes little on them (before it: about 70 % of AgentKV's transfer was wasted)
    akv = result.policies["agentkv"]
    assert akv.wasted_prefetch_mb_per_batch < 0.05 * akv.transfer_mb_per_batch
    assert "NaN" not in dumps(result.to_dict())


def test_signals_of_the_real_trace_come_from_its_own_silences(traces_dir):
    path = _trace(traces_dir, "mooncake_fast25_conversation_trace.jsonl")
    events = load_trace(path, "mooncake").events
    rc = ReplayConfig(sessions=SAMPLE_SESSIONS, idle_timeout_s=120.0)
    sessions = sessions_of(events)[:SAMPLE_SESSIONS]
    ends = sorted(s.last_event + 120.0 for s in sessions)
    (batch,) = replay_workload(events, SimConfig(), path.name, rc).batches
    # every signal is the end of some sampled session (a silence of 120 s), never earlier
    assert set(np.round(batch.eol, 6)) <= set(np.round(ends, 6))


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
    cfg = SimConfig()
    wl = replay_workload(again.events, cfg, name, ReplayConfig(sessions=SAMPLE_SESSIONS))
    result = compare(cfg, workload=wl, policies=("lru", "agentkv"))
    assert result.policies["lru"].reads == result.policies["agentkv"].reads
    if fmt == "azure":  # no prefix or session information: nothing is ever reused
        assert result.policies["lru"].reads == 0
    else:
        assert result.policies["lru"].reads > 0
    if fmt == "tracelab":  # the trace's tool gaps reach the replay, gap by gap
        (b,) = wl.batches
        tools = {t for gaps in b.gap_tools for t in gaps if t}
        assert tools and max(float(s.max()) for s in b.gap_tool_s) > 0.0
