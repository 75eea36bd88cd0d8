"""Requests whose blocks AgentKV cannot name, or may no longer serve, are left to vLLM.

- Block identities chain token ids (with the model, adapter and cache salt): a request
  with images or prompt embeddings can hold other KV under the same token ids (vLLM's own
  block hash adds those inputs). It used to match, and restore, another image's blocks;
  it is neither looked up nor saved now (its lifecycle events still count).
- With the service backend, a request whose caller was given up on after its lookup (an
  internal error while planning its saves) still answered that lookup when vLLM asked
  again (preempted, resumed): vLLM then waited for an asynchronous load nobody planned,
  holding the request's blocks for good. It is computed as usual now.
No engine: the scheduler side runs on stand-ins for vLLM's request and scheduler output."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agentkv_cluster.engines.vllm.backend import Caller, ConnectorCounters
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from tests.unit.engines.test_vllm_failed_loads import (
    BS,
    VERSIONS,
    _blocks,
    _request,
    _saved,
    _scheduler,
    _step,
)


@pytest.mark.parametrize("extra", [{"mm_features": [object()]},
                                   {"prompt_embeds": object()}])
def test_a_request_with_inputs_beyond_its_tokens_is_neither_matched_nor_saved(extra):
    sched = _scheduler()
    writer = _request("w", 3 * BS + 1, session="t")
    sched.arrived(writer)
    sched.get_num_new_matched_tokens(writer, 0)
    assert _saved(sched.build_connector_meta(_step(new=[(writer, [0, 1, 2, 3], 0)]))) == [0, 1, 2]
    other = _request("o", 3 * BS + 1)  # the same token ids, another image
    for name, value in extra.items():
        setattr(other, name, value)
    sched.arrived(other)
    assert sched.get_num_new_matched_tokens(other, 0) == (0, False)
    assert _saved(sched.build_connector_meta(_step(new=[(other, [4, 5, 6, 7], 0)]))) == []
    assert sched.counters.lookups == 1  # the writer's only


class _Remote:
    """A service-like backend that holds the blocks it is asked about."""

    def resolve(self, token, session):
        return Caller(tenant="acme", session=session or "")

    def lookup(self, caller, identities):
        return sum(1 for i in identities if i.end - i.start == BS)

    def event(self, caller, event):
        pass

    def close(self):
        pass


def test_a_remote_lookup_is_not_answered_once_its_caller_was_given_up_on():
    sched = SchedulerSide(_Remote(), VERSIONS, BS, ConnectorCounters(), remote=True,
                          lookup_timeout_s=5.0, async_load=True, min_tail_tokens=0)
    req = _request("r", 4 * BS + 1)
    req.max_tokens = 1 << 20
    try:
        sched.arrived(req)
        while (got := sched.get_num_new_matched_tokens(req, 0))[0] is None:
            time.sleep(0.01)
        assert got[0] > 0 and got[1] is True  # an asynchronous load of what it found
        sched._reqs["r"].caller = None  # what planning.SavePlanner.plan does on an error
        got = sched.get_num_new_matched_tokens(req, 0)  # preempted, asked again
        assert got == (0, False)
        sched.update_state_after_alloc(req, _blocks([7, 8, 9, 10, 11]), 0)
        assert sched.build_connector_meta(SimpleNamespace(
            scheduled_new_reqs=[], scheduled_cached_reqs=SimpleNamespace(
                req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
            num_scheduled_tokens={})).requests == []
    finally:
        sched.close()
