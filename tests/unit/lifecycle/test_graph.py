"""Event graph: nodes, edges, producers/consumers, retirement, dependency strength."""

from __future__ import annotations

import pytest

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_base import PageStillNeeded, UnknownNode
from agentkv_cluster.lifecycle.graph_records import Blocker as B
from agentkv_cluster.lifecycle.graph_records import (
    EdgeKind,
    NodeInfo,
    NodeKind,
    PageInfo,
    RetentionPolicy,
)
from agentkv_cluster.lifecycle.types import PageId, TypeTag, UnknownPage
from agentkv_cluster.lifecycle.types import StateType as T
from tests.unit.lifecycle.builders import Session, ref, snapshot

P = PageId


def started(**policy: object) -> tuple[EventGraph, Session]:
    g, s = EventGraph(RetentionPolicy(**policy)), Session()  # type: ignore[arg-type]
    touched = g.apply(s.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,),
                             input_pages=(2,)), now=0.0)
    assert touched == {1, 2}
    return g, s


def call(g: EventGraph, call_id: str, task: str = "task-1") -> int:
    return g.node_for_call("acme", "s1", task, call_id)


def test_one_tool_call_builds_nodes_edges_and_page_sets() -> None:
    g, s = started()
    assert g.apply(s.make(ev.ModelCall, call_id="m1", consumes=(1, 2),
                          produces=(ref(10, T.TEMP_REASONING),)), now=1.0) == {1, 2, 10}
    m1 = call(g, "m1")
    assert not g.node(m1).done
    assert g.apply(s.make(ev.ToolStart, call_id="t1", tool="pytest", consumes=(10,)),
                   now=2.0) == {10}
    t1 = call(g, "t1")
    assert g.node(m1).done and not g.node(t1).done  # a model call ends when its branch moves on
    assert g.apply(s.make(ev.ObservationReturn, call_id="t1",
                          produces=(ref(20, T.TOOL_OBSERVATION),)), now=3.0) == {20}
    (obs,) = g.node(t1).successors
    assert [g.node(n).kind for n in (m1, t1, obs)] == [
        NodeKind.MODEL_CALL, NodeKind.TOOL_CALL, NodeKind.OBSERVATION]
    assert g.node(m1).successors == {t1}
    assert g.node(t1).done and g.node(obs).done
    assert (g.page(P(10)).producers, g.page(P(10)).consumers) == ({m1}, {t1})
    assert (g.page(P(20)).producers, g.page(P(20)).consumers) == ({obs}, frozenset())
    assert (g.page(P(1)).producers, g.page(P(1)).consumers) == (frozenset(), {m1})
    assert g.edges(EdgeKind.DATA) == {(m1, t1)}
    assert g.edges(EdgeKind.CONTROL) == {(m1, t1), (t1, obs)}
    assert g.page(P(20)).tag == TypeTag(state_type=T.TOOL_OBSERVATION)
    assert (g.page(P(20)).version, g.page(P(20)).last_touch) == (4, 3.0)
    assert g.page(P(1)).last_touch == 1.0
    st = g.stats()
    assert (st.nodes, st.control_edges, st.data_edges, st.pages, st.summary_nodes) == (
        3, 2, 1, 4, 0)


def test_blockers_through_a_task() -> None:
    g, s = started()
    g.apply(s.make(ev.ModelCall, call_id="m1", consumes=(1, 2),
                   produces=(ref(10, T.TEMP_REASONING),)), now=1.0)
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="pytest", consumes=(10,)), now=2.0)
    assert g.blockers(P(10)) == {B.CONSUMER, B.CONTEXT}
    g.apply(s.make(ev.ObservationReturn, call_id="t1",
                   produces=(ref(20, T.TOOL_OBSERVATION),)), now=3.0)
    table = {1: {B.GENERATION}, 2: {B.CONTEXT}, 10: {B.CONTEXT}, 20: {B.CONTEXT}}
    assert {p: g.blockers(P(p)) for p in table} == table
    g.apply(s.make(ev.TaskEnd), now=4.0)
    table = {1: {B.GENERATION}, 2: set(), 10: set(), 20: set()}
    assert {p: g.blockers(P(p)) for p in table} == table
    assert [g.is_retirable(P(p)) for p in (1, 2, 10, 20)] == [False, True, True, True]


def test_rolled_back_consumer_and_rollback_hold() -> None:
    g, s = started()
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="search"), now=1.0)  # v2
    g.apply(s.make(ev.ObservationReturn, call_id="t1",
                   produces=(ref(20, T.TOOL_OBSERVATION),)), now=2.0)  # v3
    g.apply(s.make(ev.BranchCreate, branch="b1"), now=3.0)  # v4: forks after page 20 exists
    g.apply(s.make(ev.ToolStart, call_id="t2", tool="search", branch="b1",
                   consumes=(20,)), now=4.0)  # v5
    g.apply(s.make(ev.ObservationReturn, call_id="t2",
                   produces=(ref(30, T.TOOL_OBSERVATION),)), now=5.0)  # v6, on b1
    g.apply(s.make(ev.ToolStart, call_id="t4", tool="search", branch="b1",
                   consumes=(20,)), now=5.5)  # v7: still running
    g.apply(s.make(ev.ToolStart, call_id="t3", tool="search"), now=6.0)  # v8
    g.apply(s.make(ev.ObservationReturn, call_id="t3", produces=(ref(21, T.TOOL_OBSERVATION),),
                   supersedes=(20,)), now=7.0)  # v9
    assert g.page(P(20)).tag.cold
    assert g.blockers(P(20)) == {B.CONSUMER, B.ROLLBACK}
    assert g.blockers(P(30)) == {B.CONTEXT}
    touched = g.apply(s.make(ev.Rollback, branch="b1"), now=8.0)
    assert touched == {30}
    assert g.page(P(30)).tag == TypeTag(state_type=T.FAILED_BRANCH, cold=True)
    assert g.blockers(P(20)) == frozenset()  # its only unfinished consumer will never run
    assert g.blockers(P(30)) == {B.AUDIT}  # failed branch keeps an audit summary first
    assert g.dependency_strength(P(20)) == 0.0
    g.record_audit_summary(P(30))
    assert g.is_retirable(P(30))


def test_rollback_takes_open_descendants() -> None:
    g, s = started()
    g.apply(s.make(ev.BranchCreate, branch="b1"), now=1.0)
    g.apply(s.make(ev.BranchCreate, branch="b2", parent="b1"), now=1.0)
    g.apply(s.make(ev.ModelCall, call_id="m", branch="b2",
                   produces=(ref(40, T.TEMP_REASONING),)), now=2.0)
    assert g.apply(s.make(ev.Rollback, branch="b1"), now=3.0) == {40}
    assert g.page(P(40)).tag.state_type is T.FAILED_BRANCH
    with pytest.raises(ev.ConflictingEvent, match="abandoned"):
        g.apply(s.make(ev.ModelCall, call_id="m2", branch="b2"), now=4.0)


def test_observation_returning_to_abandoned_branch_is_failed() -> None:
    g, s = started()
    g.apply(s.make(ev.BranchCreate, branch="b1"), now=1.0)
    g.apply(s.make(ev.ToolStart, call_id="t", tool="db", branch="b1"), now=2.0)
    g.apply(s.make(ev.Rollback, branch="b1"), now=3.0)
    g.apply(s.make(ev.ObservationReturn, call_id="t",
                   produces=(ref(50, T.EVIDENCE),)), now=4.0)
    assert g.page(P(50)).tag.state_type is T.FAILED_BRANCH
    assert g.blockers(P(50)) == {B.AUDIT}


def test_verification_commits_temporary_reasoning() -> None:
    g, s = started()
    g.apply(s.make(ev.ModelCall, call_id="m1", produces=(ref(10, T.TEMP_REASONING),)), now=1.0)
    assert g.apply(s.make(ev.VerificationPass, call_id="v1", pages=(10,)), now=2.0) == {10}
    v1 = call(g, "v1")
    assert (g.node(v1).kind, g.node(v1).done) == (NodeKind.VERIFICATION, True)
    assert g.page(P(10)).tag.state_type is T.VERIFIED_RESULT
    assert g.page(P(10)).consumers == {v1}
    g.apply(s.make(ev.TaskEnd), now=3.0)
    assert g.blockers(P(10)) == {B.AUDIT}  # never irreversibly deleted before its summary
    g.record_audit_summary(P(10))
    assert g.is_retirable(P(10))


def test_prefix_version_bump() -> None:
    g, a = started()
    b = a.for_task("task-2")
    touched = g.apply(b.make(ev.TaskStart, prefix_generation=1, prefix_pages=(5,)), now=1.0)
    assert touched == {1, 5}
    assert g.current_generation("acme") == 1
    assert g.page(P(1)).tag == TypeTag(state_type=T.FIXED_PREFIX, generation=0, read_only=True)
    assert g.page(P(5)).tag == TypeTag(state_type=T.FIXED_PREFIX, generation=1)
    # the in-flight task keeps reading the old generation
    g.apply(a.make(ev.ModelCall, call_id="m1", consumes=(1,)), now=2.0)
    before = snapshot(g)
    bad = [
        (b.make(ev.ModelCall, call_id="m2", consumes=(1,)), "not reusable"),
        (a.for_task("task-3").make(ev.TaskStart, prefix_generation=1, prefix_pages=(1,)),
         "never reuse"),
        (a.for_task("task-4").make(ev.TaskStart, prefix_generation=0), "older than 1"),
    ]
    for event, message in bad:
        with pytest.raises(ev.ConflictingEvent, match=message):
            g.apply(event, now=3.0)
        assert snapshot(g) == before
    assert g.blockers(P(1)) == {B.GENERATION, B.CONSUMER}  # m1 is still running on it
    g.apply(a.make(ev.TaskEnd), now=4.0)
    assert g.is_retirable(P(1))
    assert g.blockers(P(5)) == {B.GENERATION}  # current generation: new tasks reuse it
    g.retire(P(1))
    assert P(1) not in g.page_ids()


def test_prefix_pages_never_cross_tenants() -> None:
    g, _ = started()  # acme's prefix page 1
    globex = Session(tenant="globex", session="g1", task_id="gt")
    before = snapshot(g)
    with pytest.raises(ev.ConflictingEvent, match="another tenant"):
        g.apply(globex.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,)), now=1.0)
    assert snapshot(g) == before
    g.apply(globex.make(ev.TaskStart, prefix_generation=0, prefix_pages=(8,)), now=1.0)
    with pytest.raises(ev.ConflictingEvent, match="another tenant"):
        g.apply(globex.make(ev.ModelCall, call_id="m", consumes=(1,)), now=2.0)
    # generations are per tenant: globex bumping leaves acme's prefix current
    g.apply(globex.for_task("gt2").make(ev.TaskStart, prefix_generation=3), now=3.0)
    assert (g.current_generation("acme"), g.current_generation("globex")) == (0, 3)
    assert not g.page(P(1)).tag.read_only and g.page(P(8)).tag.read_only


def test_dependency_strength_table() -> None:
    g, s = started()
    g.apply(s.make(ev.ModelCall, call_id="m1", consumes=(2,),
                   produces=(ref(10, T.TEMP_REASONING),)), now=1.0)
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="x", consumes=(10,)), now=2.0)
    g.apply(s.make(ev.BranchCreate, branch="side"), now=3.0)
    g.apply(s.make(ev.ModelCall, call_id="m2", branch="side", consumes=(10,),
                   produces=(ref(11, T.TEMP_REASONING),)), now=4.0)
    g.apply(s.make(ev.ToolStart, call_id="t2", tool="x", branch="side", consumes=(11,)), now=5.0)
    g.apply(s.make(ev.ToolStart, call_id="t3", tool="x", consumes=(10,)), now=6.0)
    other = s.for_task("task-2")
    g.apply(other.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,)), now=7.0)
    expected = {
        1: 0.75,  # two open tasks started on the prefix
        2: 0.5,  # live context only (its consumer m1 is done)
        10: 1 - 0.5**3,  # t1, t3 unfinished (m2 ended when t2 began) + live context
        11: 1 - 0.5**1,  # t2 unfinished + live context, side branch weighs half
    }
    assert {p: g.dependency_strength(P(p)) for p in expected} == pytest.approx(expected)
    g.apply(s.make(ev.TaskEnd), now=8.0)
    assert g.dependency_strength(P(10)) == 0.0


def test_register_candidate_consumer_blocks_until_done() -> None:
    g, s = started()
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="x"), now=1.0)
    g.apply(s.make(ev.ObservationReturn, call_id="t1",
                   produces=(ref(20, T.TOOL_OBSERVATION),)), now=2.0)
    g.apply(s.make(ev.ToolStart, call_id="t2", tool="x"), now=3.0)
    g.apply(s.make(ev.ObservationReturn, call_id="t2", produces=(ref(21, T.TOOL_OBSERVATION),),
                   supersedes=(20,)), now=4.0)
    assert g.blockers(P(20)) == frozenset()
    g.apply(s.make(ev.ToolStart, call_id="t3", tool="x"), now=5.0)
    g.register_consumer(P(20), call(g, "t3"))
    assert g.blockers(P(20)) == {B.CONSUMER}
    with pytest.raises(PageStillNeeded, match="consumer"):
        g.retire(P(20))
    g.apply(s.make(ev.ObservationReturn, call_id="t3"), now=6.0)
    g.retire(P(20))
    assert P(20) not in g.page_ids()
    for query in (g.blockers, g.is_retirable, g.dependency_strength, g.page, g.retire):
        with pytest.raises(UnknownPage):
            query(P(20))
    with pytest.raises(UnknownNode):
        g.register_consumer(P(21), 999)
    with pytest.raises(UnknownNode):
        g.node_for_call("acme", "s1", "task-1", "never")


def test_unknown_ids_are_lookup_errors() -> None:
    # callers (the controller) treat "not in the graph" as a KeyError
    assert issubclass(UnknownPage, KeyError) and issubclass(UnknownNode, KeyError)


def test_page_and_node_views() -> None:
    g, s = started()
    g.apply(s.make(ev.ModelCall, call_id="m1", consumes=(2,),
                   produces=(ref(10, T.EVIDENCE),)), now=1.5)
    m1 = call(g, "m1")
    assert g.page(P(10)) == PageInfo(
        page_id=P(10), tag=TypeTag(state_type=T.EVIDENCE), task=("acme", "s1", "task-1"),
        branch="main", version=2, last_touch=1.5, producers=frozenset({m1}),
        consumers=frozenset())
    assert g.page(P(1)).task is None and g.page(P(1)).branch is None
    assert g.node(m1) == NodeInfo(
        node_id=m1, kind=NodeKind.MODEL_CALL, task=("acme", "s1", "task-1"), branch="main",
        version=2, done=False, call_id="m1", successors=frozenset(), folded=0)
    assert g.page_ids() == {1, 2, 10} and g.node_ids() == {m1}


def test_retire_refusal_changes_nothing() -> None:
    g, _s = started()
    before = snapshot(g)
    for page in (1, 2):
        with pytest.raises(PageStillNeeded):
            g.retire(P(page))
    assert snapshot(g) == before


def _bad_events(s: Session) -> list[tuple[ev.Event, type[Exception], str]]:
    other = s.for_task("task-2")
    return [
        (s.for_task("nope").make(ev.ModelCall, call_id="x"), ev.UnknownReference, "task"),
        (s.make(ev.TaskStart, prefix_generation=0), ev.ConflictingEvent, "already started"),
        (s.make(ev.ModelCall, call_id="x", branch="b9"), ev.UnknownReference, "branch"),
        (s.make(ev.ModelCall, call_id="m1"), ev.ConflictingEvent, "already exists"),
        (s.make(ev.ModelCall, call_id="x", consumes=(2, 99)), ev.UnknownReference, "page 99"),
        (s.make(ev.ModelCall, call_id="x", consumes=(70,)), ev.ConflictingEvent, "another task"),
        (s.make(ev.ModelCall, call_id="x", produces=(ref(70, T.EVIDENCE),)),
         ev.ConflictingEvent, "another task"),
        (s.make(ev.ModelCall, call_id="x", produces=(ref(1, T.EVIDENCE),)),
         ev.ConflictingEvent, "shared prefix"),
        (s.make(ev.ModelCall, call_id="x", version=-1), ev.InvalidField, "version"),
        (s.make(ev.ModelCall, call_id="x", ts=float("inf")), ev.InvalidField, "ts"),
        (s.make(ev.ModelCall, call_id="x", session=""), ev.InvalidField, "session"),
        (s.make(ev.ModelCall, call_id="x", produces=(ref(71, T.FIXED_PREFIX),)),
         ev.ConflictingEvent, "TaskStart only"),
        (s.make(ev.ObservationReturn, call_id="zz"), ev.UnknownReference, "no tool call"),
        (s.make(ev.ObservationReturn, call_id="m1"), ev.UnknownReference, "no tool call"),
        (s.make(ev.ObservationReturn, call_id="t1"), ev.ConflictingEvent, "already returned"),
        (s.make(ev.ObservationReturn, call_id="t2", supersedes=(10,)),
         ev.ConflictingEvent, "not a tool observation"),
        (s.make(ev.VerificationPass, call_id="v", pages=(20,)),
         ev.ConflictingEvent, "not temporary reasoning"),
        (s.make(ev.Rollback, branch="main"), ev.ConflictingEvent, "main branch"),
        (s.make(ev.BranchCreate, branch="b1"), ev.ConflictingEvent, "already exists"),
        (s.make(ev.BranchCreate, branch="b2", parent="gone"), ev.UnknownReference, "gone"),
        (other.make(ev.ModelCall, call_id="x"), ev.ConflictingEvent, "ended"),
        (s.for_task("task-6").make(ev.TaskStart, prefix_generation=0, input_pages=(2,)),
         ev.ConflictingEvent, "already exists"),
        (s.make(ev.TaskStart, task_id="task-5", prefix_generation=0, prefix_pages=(2,)),
         ev.ConflictingEvent, "not a generation-0 prefix"),
    ]


def test_every_rejected_event_leaves_the_graph_unchanged() -> None:
    g, s = started()
    other = s.for_task("task-2")
    g.apply(other.make(ev.TaskStart, prefix_generation=0, input_pages=(70,)), now=0.5)
    g.apply(other.make(ev.TaskEnd), now=0.6)
    g.apply(s.make(ev.ModelCall, call_id="m1", produces=(ref(10, T.TEMP_REASONING),)), now=1.0)
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="x"), now=2.0)
    g.apply(s.make(ev.ObservationReturn, call_id="t1",
                   produces=(ref(20, T.TOOL_OBSERVATION),)), now=3.0)
    g.apply(s.make(ev.ToolStart, call_id="t2", tool="x"), now=4.0)
    g.apply(s.make(ev.BranchCreate, branch="b1"), now=5.0)
    before = snapshot(g)
    for event, error, message in _bad_events(s):
        with pytest.raises(error, match=message):
            g.apply(event, now=9.0)
        assert snapshot(g) == before, event
    with pytest.raises(ev.UnknownEventKind):
        g.apply(object(), now=9.0)  # type: ignore[arg-type]
    assert snapshot(g) == before
