"""vLLM calls ``update_state_after_alloc`` for every
request, AgentKV's or not. A request with no caller (here: a token the service refused)
plans no restore and reports no internal error: without the guard, planning ran
for it, raised, and every such request was reported with "internal error in the AgentKV
restore" (and an exception logged each step)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.blocks import EngineVersions
from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide

VERSIONS = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")
BS = 16


def test_a_request_whose_caller_was_refused_plans_nothing_and_reports_no_error(caplog):
    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")), VERSIONS, BS,
                          ConnectorCounters(), remote=False, lookup_timeout_s=1.0,
                          async_load=True, min_tail_tokens=0)
    ids = list(range(100, 100 + 2 * BS + 1))
    req = SimpleNamespace(request_id="plain", prompt_token_ids=list(ids), all_token_ids=ids,
                          output_token_ids=[], num_computed_tokens=0,
                          kv_transfer_params={"agentkv": {"session": "s", "token": 7}})
    sched.arrived(req)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    with caplog.at_level(logging.ERROR):
        sched.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([0, 1, 2],)),
                                       0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    meta = sched.build_connector_meta(SimpleNamespace(
        scheduled_new_reqs=[], num_scheduled_tokens={},
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              resumed_req_ids=set(), num_computed_tokens=[])))
    assert meta.requests == []
    report = sched.request_finished(req, [0, 1, 2])[1]
    assert not any("internal error" in e for e in ((report or {}).get("agentkv", {})
                                                  .get("errors", [])))
