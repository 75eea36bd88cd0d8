"""The demo's trace replay plan: whole sessions, pages from tokens, per-step tools."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.api.workload import WorkloadSpec, episodes_from_trace
from agentkv_cluster.sim.trace.format import TraceFormatError

EVENTS = [
    {"session": "a", "ts": 0.0, "kind": "model_call", "tokens": 1024, "prefix_blocks": [1, 2]},
    {"session": "a", "ts": 0.2, "kind": "tool_start", "tool_class": "bash",
     "tool_duration_s": 4.0},
    {"session": "a", "ts": 5.0, "kind": "model_call", "tokens": 2048,
     "prefix_blocks": [1, 2, 3, 4]},
    {"session": "a", "ts": 9.0, "kind": "model_call", "tokens": 2560,
     "prefix_blocks": [1, 2, 3, 4, 5]},
    {"session": "b", "ts": 1.0, "kind": "model_call", "tokens": 512, "prefix_blocks": [1]},
    {"session": "c", "ts": 2.0, "kind": "model_call", "tokens": 512, "prefix_blocks": [9]},
]


def _trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
    return path


def test_whole_sessions_become_episodes_with_trace_tools_and_token_pages(tmp_path):
    spec = WorkloadSpec()
    eps = episodes_from_trace(_trace(tmp_path), "agentkv", 2, memory_bytes=1 << 40,
                              max_page_bytes=1 << 40, spec=spec)
    assert [e.session for e in eps] == ["a", "b"]  # first two by start, c left out whole
    a = eps[0]
    # block 1 is shared with b: a fixed prefix; block 2 is a's own input
    assert a.first == ((512, "fixed_prefix"), (512, "task_input"))
    # every later call of the session is a step: its tool and its new blocks, packed
    # into pages of up to one arena page (here: unbounded, so one page per call)
    assert [(s.tool, s.tokens) for s in a.steps] == [("bash", (1024,)), ("think", (512,))]
    assert a.steps[0].tool_s == pytest.approx(0.5 * 4.0 / 4.0)  # the median is scaled to 0.5
    assert spec.resumes() == 12 * 3  # synthetic default: sessions x turns
    demo = WorkloadSpec(sessions=len(eps), episodes=eps)
    assert demo.resumes() == 2
    assert demo.working_set() == demo.page_bytes(512) * 6


def test_pages_are_scaled_to_the_demo_memory_and_arena_page(tmp_path):
    spec = WorkloadSpec()
    eps = episodes_from_trace(_trace(tmp_path), "agentkv", 3,
                              memory_bytes=spec.page_bytes(512) * 7 // 2,
                              max_page_bytes=spec.page_bytes(512))
    tokens = [t for e in eps for t, _ in e.pages()]
    assert max(tokens) <= 512  # no page above the arena page
    assert sum(tokens) == 7 * int(512 * 0.5)  # seven blocks, one scale factor (1/2)
    demo = WorkloadSpec(sessions=len(eps), episodes=eps)
    assert demo.working_set() <= spec.page_bytes(512) * 7 // 2


def test_no_session_exceeds_the_session_bound(tmp_path):
    spec = WorkloadSpec()
    eps = episodes_from_trace(_trace(tmp_path), "agentkv", 3, memory_bytes=1 << 40,
                              max_page_bytes=1 << 40, max_session_bytes=spec.page_bytes(1000))
    assert max(sum(spec.page_bytes(t) for t, _ in e.pages()) for e in eps) \
        <= spec.page_bytes(1000)


def test_a_trace_without_model_calls_is_a_clear_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"session": "a", "ts": 0.0, "kind": "task_end"}) + "\n")
    with pytest.raises(TraceFormatError, match="no model_call"):
        episodes_from_trace(path, "agentkv", 2, memory_bytes=1, max_page_bytes=1)
