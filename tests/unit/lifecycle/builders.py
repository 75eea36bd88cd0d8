"""Event builders for the lifecycle tests: one session, versions strictly increasing."""

from __future__ import annotations

import itertools
from typing import Any

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.types import PageId, StateType


def ref(page: int, state_type: StateType) -> ev.PageRef:
    return ev.PageRef(page, state_type)


class Session:
    """Makes events for one (tenant, session, task) with fresh ids and versions."""

    def __init__(self, tenant: str = "acme", session: str = "s1", task_id: str = "task-1",
                 start: int = 1) -> None:
        self.tenant, self.session, self.task_id = tenant, session, task_id
        self._ids = itertools.count(start)

    def make(self, cls: type[ev.Event], **fields: Any) -> ev.Event:
        n = next(self._ids)
        base = {"event_id": n, "tenant": self.tenant, "session": self.session,
                    "task_id": self.task_id, "version": n, "ts": float(n)}
        base.update(fields)
        return cls(**base)

    def for_task(self, task_id: str) -> Session:
        other = Session(self.tenant, self.session, task_id)
        other._ids = self._ids  # one version sequence per session
        return other


def snapshot(g: EventGraph) -> tuple:
    """Everything observable about a graph, for "nothing changed" assertions."""
    pages = {}
    for pid in sorted(g.page_ids()):
        pages[pid] = (g.page(PageId(pid)), sorted(b.value for b in g.blockers(PageId(pid))))
    nodes = {n: g.node(n) for n in sorted(g.node_ids())}
    # task internals have no public view; they are compared only for equality here
    tasks = {k: (t.open, {b.name: (b.status, b.head, b.nodes, sorted(b.pages))
                          for b in t.branches.values()}, dict(t.calls), list(t.window))
             for k, t in g._tasks.items()}
    return (g.stats(), pages, nodes, tasks, dict(g._versions), dict(g._generations))
