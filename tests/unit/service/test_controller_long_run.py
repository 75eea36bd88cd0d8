"""A controller that runs task after task keeps no trace of the tasks and pages that are
gone, and a page two sessions stored (one identity) stays with the session still using it.
Both found from outside, under many rounds of many sessions."""

from __future__ import annotations

from typing import Any

from agentkv_cluster.lifecycle.graph_records import Blocker
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, PageMeta
from agentkv_cluster.runtime.strategies import make_strategy

MB = 1 << 20


def meta(session: str, pid: int, kind: StateType, key: bytes | None = None) -> PageMeta:
    return PageMeta(key=key or f"{session}/{pid}".encode(), digest=b"d" * 32, tenant="t",
                    namespace="t", session=session, page_id=pid, state_type=kind, length=MB,
                    tokens=16)


class Session:
    """One session's events, numbered in order."""

    def __init__(self, ctl: Controller, name: str) -> None:
        self.ctl, self.name, self.version = ctl, name, 0
        ctl.table.open_session("t", name)

    def store(self, *metas: PageMeta) -> None:
        out, _ = self.ctl.admit("t", self.name, list(metas), 0.0)
        self.ctl.ingested([g for g, needs in out if needs])

    def event(self, kind: str, task: str, **fields: Any) -> list:
        self.version += 1
        data = {"kind": kind, "event_id": self.version, "task_id": task,
                "version": self.version, "ts": float(self.version), **fields}
        return self.ctl.apply(self.ctl.events.translate("t", self.name, data), float(self.version))


def test_tasks_that_ended_leave_no_page_ids_tasks_or_nodes_behind() -> None:
    """Regression: each retired page left its (tenant, session, page id) entry, and each
    ended task its task and nodes in the event graph, for as long as the service ran:
    memory grew with every round of every session, though every page was retired."""
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 64 * MB)
    s = Session(ctl, "a")
    s.store(meta("a", 0, StateType.FIXED_PREFIX))  # read by every task: stays
    for r in range(1, 41):
        base = 10 * r
        s.store(*(meta("a", base + i, kind) for i, kind in enumerate(
            (StateType.TASK_INPUT, StateType.EVIDENCE, StateType.TEMP_REASONING))))
        task = f"task-{r}"
        s.event("task_start", task, prefix_generation=1, prefix_pages=[0], input_pages=[base])
        s.event("model_call", task, call_id="m", consumes=[0, base],
                produces=[[base + 1, "evidence"], [base + 2, "temp_reasoning"]])
        s.event("tool_start", task, call_id="k", tool="grep")
        s.store(meta("a", base + 5, StateType.TOOL_OBSERVATION))
        s.event("observation_return", task, call_id="k", produces=[[base + 5, "tool_observation"]])
        s.event("model_call", task, call_id="m2", consumes=[base + 5])
        deleted = s.event("task_end", task)
        assert len([a for a in deleted if a.kind is ActionKind.DELETE]) == 4
    graph = ctl.events.graph
    assert sorted(ctl.table.pages) == [1]  # the prefix
    assert len(ctl.table.by_pid) == 1
    stats = graph.stats()
    assert (stats.tasks, stats.nodes, stats.pages) == (0, 0, 1)
    # the prefix names no node of the tasks that went (its blockers would raise KeyError)
    assert graph.blockers(1) == {Blocker.GENERATION} and graph.dependency_strength(1) == 0.0


def _one_page_two_sessions(kind: StateType) -> tuple[Controller, Session, Session, int]:
    """Sessions a (page id 0) and b (page id 7) store one identity: one page, its gid."""
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 64 * MB)
    a, b = Session(ctl, "a"), Session(ctl, "b")
    a.store(meta("a", 0, kind, key=b"same"))
    b.store(meta("b", 7, kind, key=b"same"))
    (gid,) = ctl.table.resolve("t", "a", [b"same"])
    return ctl, a, b, gid


def test_a_page_two_sessions_stored_stays_with_the_session_still_using_it() -> None:
    """Regression: storing an identity another session of the HBM actor holds gives its
    page (one copy); the first session's task end deleted it, and the second session's
    load of the key it had stored answered not_found."""
    ctl, a, b, gid = _one_page_two_sessions(StateType.EVIDENCE)
    a.event("task_start", "x", prefix_generation=1, input_pages=[0])
    assert [x.kind for x in a.event("task_end", "x")] == []  # b holds it: nothing deleted
    assert ctl.table.resolve("t", "b", [b"same"]) == [gid]
    assert ctl.table.by_pid.holders(gid) == {("t", "b")}
    b.event("task_start", "y", prefix_generation=1, input_pages=[7])
    assert [(x.kind, x.key) for x in b.event("task_end", "y")] == [(ActionKind.DELETE, b"same")]
    assert ctl.table.pages == {} and len(ctl.table.by_pid) == 0


def test_a_hold_dropped_from_a_shared_page_writes_no_audit_record() -> None:
    """A session whose task ends while another session still holds a shared verified page
    only drops its hold: the page is not retired, so no §5.2 summary may say it was (one
    was written, and the page lived on); its last holder's retirement writes the one."""
    ctl, a, b, gid = _one_page_two_sessions(StateType.TEMP_REASONING)
    a.event("task_start", "x", prefix_generation=1)
    a.event("model_call", "x", call_id="m1", produces=[[0, "temp_reasoning"]])
    a.event("verification_pass", "x", call_id="v1", pages=[0])
    assert ctl.table.pages[gid].view.state_type is StateType.VERIFIED_RESULT
    assert a.event("task_end", "x") == []
    assert ctl.events.drain_audit() == []  # nothing was retired
    assert gid in ctl.table.pages and ctl.table.by_pid.holders(gid) == {("t", "b")}
    b.event("task_start", "y", prefix_generation=1)
    assert [(x.kind, x.key) for x in b.event("task_end", "y")] == [(ActionKind.DELETE, b"same")]
    assert [s.state_type for s in ctl.events.drain_audit()] == [StateType.VERIFIED_RESULT]
