"""Random event streams: every event is applied or rejected whole, and invariants hold."""

from __future__ import annotations

import itertools
import random

import pytest

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.graph_base import PageStillNeeded
from agentkv_cluster.lifecycle.graph_records import EdgeKind, RetentionPolicy
from agentkv_cluster.lifecycle.types import PageId, StateType
from tests.unit.lifecycle.builders import Session, ref, snapshot

TYPES = [StateType.TEMP_REASONING, StateType.TOOL_OBSERVATION, StateType.EVIDENCE]


class Stream:
    """Mostly plausible events (so most apply), with a share of wrong ones."""

    def __init__(self, rng: random.Random, g: EventGraph) -> None:
        self.rng, self.g, self.s = rng, g, Session()
        self.open: list[str] = []
        self.tasks = itertools.count()
        self.fresh = itertools.count(1000)

    def pages(self, n: int) -> tuple[int, ...]:
        pool = sorted(self.g.page_ids()) + [next(self.fresh) for _ in range(2)]
        return tuple(self.rng.sample(pool, min(n, len(pool))))

    def next(self) -> ev.Event:
        rng = self.rng
        if not self.open or rng.random() < 0.04:
            task_id = f"k{next(self.tasks)}"
            return self.s.for_task(task_id).make(
                ev.TaskStart, prefix_generation=rng.choice([0, 0, 0, 1]),
                prefix_pages=(rng.choice([1, 2]),), input_pages=(next(self.fresh),))
        t = self.s.for_task(rng.choice(self.open[-3:]))
        call, branch = f"c{rng.randrange(8)}", rng.choice(["main", "main", "b1", "b2"])
        pages = self.pages(rng.randrange(3))
        produce = tuple(ref(next(self.fresh), rng.choice(TYPES)) for _ in range(rng.randrange(2)))
        kind = rng.choices(range(7), [6, 6, 6, 2, 2, 1, 1])[0]
        return [
            lambda: t.make(ev.ModelCall, call_id=call, branch=branch, consumes=pages,
                           produces=produce),
            lambda: t.make(ev.ToolStart, call_id=call, tool="x", branch=branch, consumes=pages),
            lambda: t.make(ev.ObservationReturn, call_id=call, produces=produce,
                           supersedes=pages[:1]),
            lambda: t.make(ev.BranchCreate, branch=branch, parent=rng.choice(["main", "b1"])),
            lambda: t.make(ev.VerificationPass, call_id=f"v{call}", branch=branch,
                           pages=pages[:1]),
            lambda: t.make(ev.Rollback, branch=branch),
            lambda: t.make(ev.TaskEnd),
        ][kind]()

    def applied(self, event: ev.Event) -> None:
        if isinstance(event, ev.TaskStart):
            self.open.append(event.task_id)
        elif isinstance(event, ev.TaskEnd):
            self.open.remove(event.task_id)


def _check_invariants(g: EventGraph) -> None:
    nodes = g.node_ids()
    for pid in g.page_ids():
        info = g.page(pid)
        assert info.producers <= nodes and info.consumers <= nodes
        assert 0.0 <= g.dependency_strength(pid) < 1.0
        assert g.is_retirable(pid) == (not g.blockers(pid))
    for src, dst in g.edges(EdgeKind.CONTROL):
        assert src in nodes and dst in nodes and src != dst


@pytest.mark.parametrize("seed", range(4))
def test_random_stream_is_atomic_and_consistent(seed: int) -> None:
    rng = random.Random(seed)
    g = EventGraph(RetentionPolicy(window=3))
    stream = Stream(rng, g)
    applied = rejected = retired = 0
    for step in range(300):
        event = stream.next()
        before = snapshot(g)
        try:
            g.apply(event, now=float(step))
        except ev.EventValidationError:
            assert snapshot(g) == before
            rejected += 1
        else:
            stream.applied(event)
            applied += 1
        if step % 5 == 0:
            for pid in sorted(g.page_ids()):
                if g.is_retirable(pid):
                    g.retire(PageId(pid))
                    retired += 1
                else:
                    with pytest.raises(PageStillNeeded):
                        g.retire(PageId(pid))
        _check_invariants(g)
    assert applied > 50 and rejected > 50 and retired > 10, (applied, rejected, retired)
