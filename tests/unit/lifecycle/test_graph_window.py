"""Bounded version window: loops fold into conservative summary nodes; memory stays bounded."""

from __future__ import annotations

import gc
import tracemalloc

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_records import Blocker as B
from agentkv_cluster.lifecycle.graph_records import NodeKind, RetentionPolicy
from agentkv_cluster.lifecycle.types import PageId
from agentkv_cluster.lifecycle.types import StateType as T
from tests.unit.lifecycle.builders import Session, ref

P = PageId


def _start(window: int) -> tuple[EventGraph, Session]:
    g, s = EventGraph(RetentionPolicy(window=window)), Session()
    g.apply(s.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,), input_pages=(2,)),
            now=0.0)
    return g, s


def _summary(g: EventGraph) -> int:
    (sid,) = [n for n in g.node_ids() if g.node(n).kind is NodeKind.SUMMARY]
    return sid


def test_old_nodes_fold_into_one_summary() -> None:
    g, s = _start(window=3)
    for i in range(5):  # tool i reads page 1; observation i writes page 100+i
        g.apply(s.make(ev.ToolStart, call_id=f"t{i}", tool="x", consumes=(1,)), now=float(i))
        g.apply(s.make(ev.ObservationReturn, call_id=f"t{i}",
                       produces=(ref(100 + i, T.TOOL_OBSERVATION),)), now=float(i))
    # 10 nodes made; the newest 3 stay unrolled, the other 7 are one summary
    st = g.stats()
    assert (st.nodes, st.summary_nodes) == (4, 1)
    sid = _summary(g)
    assert g.node(sid).folded == 7
    unrolled = sorted(n for n in g.node_ids() if n != sid)
    assert [g.node(n).kind for n in unrolled] == [
        NodeKind.OBSERVATION, NodeKind.TOOL_CALL, NodeKind.OBSERVATION]
    # the summary keeps every reference of what it replaced (conservative)
    assert g.page(P(100)).producers == g.page(P(102)).producers == {sid}
    assert g.page(P(103)).producers == {unrolled[0]}
    assert g.page(P(1)).consumers == {sid, unrolled[1]}
    assert g.node(sid).successors == {unrolled[0]}
    assert sid not in g.node(sid).successors
    assert st.control_edges == 3


def test_unfinished_call_is_never_folded() -> None:
    g, s = _start(window=2)
    g.apply(s.make(ev.ToolStart, call_id="slow", tool="build", consumes=(2,)), now=0.0)
    for i in range(50):
        g.apply(s.make(ev.ToolStart, call_id=f"t{i}", tool="x"), now=1.0)
        g.apply(s.make(ev.ObservationReturn, call_id=f"t{i}"), now=1.0)
    slow = g.node_for_call("acme", "s1", "task-1", "slow")
    assert g.node(slow).kind is NodeKind.TOOL_CALL and not g.node(slow).done
    # the window counts the pending call too (it just never folds): slow, newest, summary
    assert g.stats().nodes == 3
    assert g.page(P(2)).producers == frozenset() and g.page(P(2)).consumers == {slow}
    assert B.CONSUMER in g.blockers(P(2))
    g.apply(s.make(ev.ObservationReturn, call_id="slow",
                   produces=(ref(9, T.EVIDENCE),)), now=2.0)
    assert B.CONSUMER not in g.blockers(P(2))


def _bounded(g: EventGraph, window: int) -> None:
    st = g.stats()
    assert st.nodes <= window + 1 and st.summary_nodes <= 1
    assert st.control_edges <= window + 1
    assert st.data_edges <= (window + 1) ** 2


def test_100k_iteration_retry_loop_stays_bounded() -> None:
    """A tool retried 100k times, rewriting one observation page each time."""
    window = 8
    g, s = _start(window)
    first = None
    for i in range(100_000):
        g.apply(s.make(ev.ToolStart, call_id=f"t{i}", tool="flaky", consumes=(1, 2, 20)
                       if i else (1, 2)), now=float(i))
        g.apply(s.make(ev.ObservationReturn, call_id=f"t{i}", ok=False,
                       produces=(ref(20, T.TOOL_OBSERVATION),)), now=float(i))
        if i == 1_000:
            first = g.stats()
            gc.collect()
            objects = len(gc.get_objects())
        if i % 10_000 == 0:
            _bounded(g, window)
        if i == 90_000:
            tracemalloc.start()
            start_bytes = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - start_bytes
    tracemalloc.stop()
    gc.collect()
    assert g.stats() == first  # same counts after 1k and 100k iterations
    assert g.stats().pages == 3
    assert g.node(_summary(g)).folded == 2 * 100_000 - window
    assert grown < 64 * 1024, grown  # 10k iterations unbounded would be megabytes
    assert len(gc.get_objects()) - objects < 200
    assert g.page(P(20)).version == s.make(ev.TaskEnd).version - 1


def test_retry_loop_with_fresh_pages_and_branches_stays_bounded() -> None:
    """Each retry forks a branch, drafts on it, rolls back; superseded pages are retired."""
    window = 6
    g, s = _start(window)
    for i in range(3_000):
        obs = 1_000 + i
        g.apply(s.make(ev.ToolStart, call_id=f"t{i}", tool="x", consumes=(2,)), now=float(i))
        g.apply(s.make(ev.ObservationReturn, call_id=f"t{i}",
                       produces=(ref(obs, T.TOOL_OBSERVATION),),
                       supersedes=(obs - 1,) if i else ()), now=float(i))
        g.apply(s.make(ev.BranchCreate, branch=f"b{i}"), now=float(i))
        draft = 100_000 + i
        g.apply(s.make(ev.ModelCall, call_id=f"m{i}", branch=f"b{i}", consumes=(obs,),
                       produces=(ref(draft, T.TEMP_REASONING),)), now=float(i))
        g.apply(s.make(ev.Rollback, branch=f"b{i}"), now=float(i))
        g.record_audit_summary(P(draft))
        g.retire(P(draft))
        if i:
            assert g.is_retirable(P(obs - 1))
            g.retire(P(obs - 1))
        if i > 10:
            _bounded(g, window)
            st = g.stats()
            assert st.pages == 3 and st.branches <= window + 1
    assert g.blockers(P(1_000 + 2_999)) == {B.CONTEXT}


def test_ended_tasks_whose_pages_retired_are_forgotten() -> None:
    """Regression (found from outside): every task ever ended stayed in the graph with its
    nodes (and summary) though all its pages had retired, so a service's graph grew with
    every task it saw. A task goes once it ended and none of its pages is left; the
    shared prefix its calls read keeps no reference to its nodes."""
    g = EventGraph(RetentionPolicy(window=3))
    s = Session()
    for r in range(1, 31):
        t = s.for_task(f"task-{r}")
        base = 10 * r
        g.apply(t.make(ev.TaskStart, prefix_generation=0, prefix_pages=(1,),
                       input_pages=(base,)), now=float(r))
        for i in range(4):  # a loop: folds into the task's summary
            g.apply(t.make(ev.ToolStart, call_id=f"k{i}", tool="x", consumes=(1, base)),
                    now=float(r))
            g.apply(t.make(ev.ObservationReturn, call_id=f"k{i}",
                           produces=(ref(base + 1 + i, T.TOOL_OBSERVATION),)), now=float(r))
        touched = g.apply(t.make(ev.TaskEnd), now=float(r))
        for page in sorted(touched - {P(1)}):
            g.retire(page)
    st = g.stats()
    assert (st.tasks, st.nodes, st.pages) == (0, 0, 1)
    assert g.blockers(P(1)) == {B.GENERATION} and g.dependency_strength(P(1)) == 0.0
    # an ended task that still holds a page stays until that page goes
    t = s.for_task("last")
    g.apply(t.make(ev.TaskStart, prefix_generation=0, input_pages=(999,)), now=40.0)
    g.apply(t.make(ev.TaskEnd), now=41.0)
    assert g.stats().tasks == 1
    g.retire(P(999))
    assert g.stats().tasks == 0 and g.page_ids() == {P(1)}
