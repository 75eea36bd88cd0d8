"""Rollback retention (paper §2.1: a page is retirable when every reachable consumer is
done and the rollback policy no longer needs it). A branch can roll back only to state
that existed when it forked: a tool observation superseded BEFORE the fork is not part of
any state the branch could return to, so it holds nothing for rollback; one superseded
after the fork still does. Plus the pure draft -> verified transition (§1.2)."""

from __future__ import annotations

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_records import Blocker as B
from agentkv_cluster.lifecycle.graph_records import RetentionPolicy
from agentkv_cluster.lifecycle.types import PageId, StateType, TypeSignal, TypeTag, retype
from tests.unit.lifecycle.builders import Session, ref

P = PageId


def _observe(g: EventGraph, s: Session, call: str, page: int, now: float,
             supersedes: tuple[int, ...] = ()) -> None:
    g.apply(s.make(ev.ToolStart, call_id=call, tool="search"), now=now)
    g.apply(s.make(ev.ObservationReturn, call_id=call,
                   produces=(ref(page, StateType.TOOL_OBSERVATION),),
                   supersedes=supersedes), now=now + 0.5)


def test_a_branch_forked_after_the_supersede_does_not_hold_the_old_observation():
    g, s = EventGraph(RetentionPolicy()), Session()
    g.apply(s.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,), input_pages=(2,)),
            now=0.0)  # v1
    _observe(g, s, "t1", 20, 1.0)  # v2, v3: page 20 exists from v3
    _observe(g, s, "t2", 21, 2.0, supersedes=(20,))  # v4, v5: page 20 cold from v5
    assert g.page(P(20)).tag.cold
    assert g.blockers(P(20)) == frozenset()  # cold, no consumer, no branch: retirable
    g.apply(s.make(ev.BranchCreate, branch="late"), now=3.0)  # v6 > 5: forks after it
    assert g.blockers(P(20)) == frozenset()
    assert g.is_retirable(P(20))
    # the live page 21 (from v5) IS part of the fork's state: held for rollback
    assert B.ROLLBACK in g.blockers(P(21))


def test_a_branch_forked_before_the_supersede_keeps_holding_it():
    g, s = EventGraph(RetentionPolicy()), Session()
    g.apply(s.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,), input_pages=(2,)),
            now=0.0)  # v1
    _observe(g, s, "t1", 20, 1.0)  # v2, v3
    g.apply(s.make(ev.BranchCreate, branch="early"), now=2.0)  # v4: 3 <= 4 < 7
    _observe(g, s, "t2", 21, 3.0, supersedes=(20,))  # v5, v6: cold from v6 > 4
    assert g.page(P(20)).tag.cold
    assert g.blockers(P(20)) == {B.ROLLBACK}


def test_verification_commits_a_draft_as_a_warm_verified_result():
    draft = TypeTag(state_type=StateType.TEMP_REASONING, cold=True)
    assert retype(draft, TypeSignal.VERIFIED) == TypeTag(
        state_type=StateType.VERIFIED_RESULT, cold=False)
