"""Type changes reach the policies when they happen, never before (no hindsight).

A trace block read by a second session becomes a shared prefix at that read; an
agent-loop reasoning page becomes a failed branch when its branch is abandoned.
Before, both were typed so from their production: the type-aware policies (AgentKV,
semantic) knew from the start which blocks a later session would share and which
branches would be dropped (found from outside: a session 5,000 s later changed
AgentKV's and semantic's decisions on every earlier read, LRU's on none)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.baselines import SemanticPolicy
from agentkv_cluster.sim.agent_loop import agent_loop_workload
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import BatchRun
from agentkv_cluster.sim.trace.format import parse_lines
from agentkv_cluster.sim.trace.replay import ReplayConfig, replay_workload
from agentkv_cluster.sim.workload import TYPE_ORDER
from tests.unit.sim.conftest import make_batch

FIXED = TYPE_ORDER.index(StateType.FIXED_PREFIX)


class _Seen(FullPrecisionDriver):
    """Records the type each read finds."""

    def __init__(self) -> None:
        super().__init__(SemanticPolicy(), SimConfig())
        self.types: list[StateType] = []

    def observe_read(self, page, idle_s, tool_s, now) -> None:
        self.types.append(page.state_type)
        super().observe_read(page, idle_s, tool_s, now)


def test_a_page_takes_its_new_type_at_the_read_it_changes_at():
    batch = dataclasses.replace(
        make_batch(sizes_mb=[10], created=[0.0], reads=[[2.0, 5.0, 7.0]], capacity_mb=100,
                   types=[StateType.TASK_INPUT]),
        retype_at=np.array([5.0]), retype_to=np.array([FIXED], np.int8))
    driver = _Seen()
    BatchRun(batch, driver).run()
    assert driver.types == [StateType.TASK_INPUT, StateType.FIXED_PREFIX,
                            StateType.FIXED_PREFIX]


def _calls(session: str, t0: float, prompt: list[int], first: int) -> list[dict]:
    ctx, out = list(prompt), []
    for k in range(6):
        ctx.append(first + k)
        out.append({"session": session, "ts": t0 + 1.5 * k, "kind": "model_call",
                    "tokens": 512 * len(ctx), "prefix_blocks": list(ctx)})
    return out


def test_a_block_a_later_session_reads_is_not_a_shared_prefix_before_that_read():
    events = [e for s in range(3) for e in _calls(f"s{s}", 0.3 * s, [100 * s + k for k in
                                                                     range(4)], 1000 + 10 * s)]
    late = {"session": "late", "ts": 5000.0, "kind": "model_call", "tokens": 2048,
            "prefix_blocks": [0, 1, 2, 3]}  # s0's prompt, long after s0 ended
    rc = ReplayConfig(kv_bytes_per_token=1000, idle_timeout_s=10.0)
    alone, with_late = (replay_workload(parse_lines(json.dumps(e) for e in ev).events,
                                        SimConfig(), "t", rc).batches[0]
                        for ev in (events, [*events, late]))
    assert np.array_equal(alone.types, with_late.types)  # as produced: the same
    prompt = [i for i in range(with_late.n_pages) if with_late.sessions[i] == "s0"][:4]
    assert all(TYPE_ORDER[with_late.types[i]] is StateType.TASK_INPUT for i in prompt)
    assert list(with_late.retype_at[prompt]) == [5000.0] * 4
    assert np.isinf(alone.retype_at).all()


def test_an_abandoned_branch_is_a_failed_branch_only_from_its_abandonment():
    wl = agent_loop_workload(SimConfig(seed=3).replace(
        workload=dataclasses.replace(SimConfig().workload, batches=4)))
    failed = TYPE_ORDER.index(StateType.FAILED_BRANCH)
    seen = 0
    for b in wl.batches:
        assert failed not in b.types  # nothing is produced as a failed branch
        for i in np.flatnonzero(b.retype_to == failed):
            assert TYPE_ORDER[b.types[i]] is StateType.TEMP_REASONING
            assert b.retype_at[i] == b.eol[i]  # at the BRANCH_ABANDONED signal
            seen += 1
    assert seen
