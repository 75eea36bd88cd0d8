"""Hints a platform may send that are malformed in less obvious ways: each is a clear
``HintError`` reported in the response (or, sent on their own, a counted and logged
datagram), never an exception inside vLLM's scheduler. No engine: the scheduler side
runs on stand-ins for vLLM's request and scheduler output."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import EngineVersions
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.hints import HintError, HintKind, parse_hints
from agentkv_cluster.engines.vllm.hintsock import HintSocket, send_hint
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide

pytestmark = pytest.mark.integration

VERSIONS = EngineVersions(model_version="m@1", tokenizer_version="tok-1", rope_config="r")
HUGE = int("1" + "0" * 400)  # a JSON integer no float holds


def _tool_start(expected):
    return {"agentkv": {"session": "s1", "events": [
        {"kind": "tool_start", "tool": "grep", "expected_s": expected}]}}


@pytest.mark.parametrize("expected", [HUGE, -HUGE])
def test_an_expected_gap_too_large_for_a_float_is_a_hint_error(expected):
    with pytest.raises(HintError, match="expected_s must be a finite number"):
        parse_hints(_tool_start(expected))


def test_a_large_expected_gap_that_fits_a_float_still_parses():
    assert parse_hints(_tool_start(10 ** 300)).events[0].expected_s == 1e300


@pytest.mark.parametrize("events", ["junk", None, {"kind": "task_end"}])
def test_malformed_events_beside_event_are_refused_not_dropped(events):
    raw = {"agentkv": {"session": "s1", "event": {"kind": "task_start"}, "events": events}}
    with pytest.raises(HintError, match="events must be a list"):
        parse_hints(raw)


def test_event_and_events_together_keep_both_in_order():
    got = parse_hints({"agentkv": {"session": "s1", "event": {"kind": "task_start"},
                                   "events": [{"kind": "task_end"}]}})
    assert [e.kind for e in got.events] == [HintKind.TASK_START, HintKind.TASK_END]


def _scheduler(hints: HintSocket | None = None) -> SchedulerSide:
    backend = EmbeddedDirectory(TokenResolver(None, "acme"))
    return SchedulerSide(backend, VERSIONS, 16, ConnectorCounters(), remote=False,
                         lookup_timeout_s=1.0, hints=hints)


def _empty_step():
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                             num_computed_tokens=[])
    return SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                           num_scheduled_tokens={})


def test_a_request_with_an_unreadable_gap_is_served_with_a_clear_error():
    sched = _scheduler()
    tokens = list(range(100, 140))
    req = SimpleNamespace(request_id="r1", kv_transfer_params=_tool_start(HUGE),
                          prompt_token_ids=tokens, all_token_ids=tokens)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    _, params = sched.request_finished(req, [])
    errors = params["agentkv"]["errors"]
    assert any("expected_s must be a finite number" in e for e in errors), errors
    assert sched.counters.hint_errors == 1


def test_an_unreadable_standalone_hint_is_counted_and_the_next_one_applies(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    sched = _scheduler(HintSocket(path))
    try:
        raw = ('{"agentkv": {"session": "s1", "events": [{"kind": "tool_start", '
               '"tool": "grep", "expected_s": ' + str(HUGE) + '}]}}')
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(raw.encode(), path)
        send_hint(path, {"session": "s2", "events": [{"kind": "tool_start", "tool": "ls"}]})
        meta = sched.build_connector_meta(_empty_step())  # raised OverflowError before
        assert sched.counters.hints_received == 2
        assert sched.counters.hint_errors == 1
        assert [(c.session, e.tool) for c, e in meta.events] == [("s2", "ls")]
    finally:
        sched.close()


class _BrokenResolver(TokenResolver):
    def resolve(self, token, session):
        raise RuntimeError("resolver bug")


def test_a_failure_applying_a_standalone_hint_never_reaches_vllms_scheduler(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    sched = SchedulerSide(EmbeddedDirectory(_BrokenResolver(None, "acme")), VERSIONS, 16,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                          hints=HintSocket(path))
    try:
        send_hint(path, {"session": "s1", "events": [{"kind": "tool_start", "tool": "ls"}]})
        meta = sched.build_connector_meta(_empty_step())  # raised RuntimeError before
        assert (sched.counters.hints_received, sched.counters.hint_errors) == (1, 1)
        assert meta.events == []
    finally:
        sched.close()
