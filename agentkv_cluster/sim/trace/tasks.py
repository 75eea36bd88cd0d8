"""Which task each trace event belongs to.

A session name may be reused: its ``task_end`` closes the task it names, and the
session's next event starts a new task (the replay counts it as a session of its
own, named ``s#2``, ``s#3``, ... after the first, made unique if the trace already
uses that name). Within one name, events are taken in time order (file order at
equal times); events at a ``task_end``'s own time belong to the task it ends.

A ``task_end`` ends a task only if that task has a ``model_call`` at or before it:
one that comes before every model call of its task (its session's first call, or
the first after the previous ``task_end``) ends nothing and is refused with the
session, the time and the reason. Moving it after the calls would invent a time
the trace does not give, and reading it as the end of an empty task would end
the real task's KV before it exists.

Pure: no I/O; works on anything with ``session``, ``ts`` and ``kind``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv_cluster.sim.trace.format import TraceEvent


@dataclass(frozen=True, slots=True)
class StrayTaskEnd:
    """A ``task_end`` that ends no task: ``index`` into the events given."""

    index: int
    session: str
    ts: float
    reason: str


@dataclass(frozen=True, slots=True)
class TaskSplit:
    """``tasks[i]``: the task name of event ``i`` (None for a stray ``task_end``)."""

    tasks: tuple[str | None, ...]
    strays: tuple[StrayTaskEnd, ...]


def split_tasks(events: Sequence[TraceEvent]) -> TaskSplit:
    """The task of every event and every ``task_end`` that ends no task."""
    by_name: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        by_name.setdefault(e.session, []).append(i)
    taken = set(by_name)
    tasks: list[str | None] = [None] * len(events)
    strays: list[StrayTaskEnd] = []
    for name, idx in by_name.items():
        idx.sort(key=lambda i: (events[i].ts, events[i].kind == "task_end"))
        calls = [events[i].ts for i in idx if events[i].kind == "model_call"]
        number, task, has_call, ended_at = 1, name, False, None
        for i in idx:
            e = events[i]
            if e.kind != "task_end":
                tasks[i] = task
                has_call = has_call or e.kind == "model_call"
                continue
            if not has_call:
                k = bisect.bisect_right(calls, e.ts)
                nxt = calls[k] if k < len(calls) else None
                strays.append(StrayTaskEnd(i, name, e.ts, _why(e, ended_at, nxt)))
                continue
            tasks[i] = task
            number, has_call, ended_at = number + 1, False, e.ts
            task = _next_name(name, number, taken)
    strays.sort(key=lambda s: s.index)
    return TaskSplit(tasks=tuple(tasks), strays=tuple(strays))


def _next_name(name: str, number: int, taken: set[str]) -> str:
    """``name#number``, unique among the trace's names and the tasks named so far."""
    candidate = f"{name}#{number}"
    while candidate in taken:
        candidate += "#"
    taken.add(candidate)
    return candidate


def _why(e: TraceEvent, ended_at: float | None, next_call: float | None) -> str:
    head = f"task_end of session {e.session!r} at ts {e.ts}"
    if ended_at is None:
        if next_call is None:
            return f"{head} ends no task: the session has no model_call"
        return f"{head} comes before the session's first model_call (ts {next_call})"
    after = ("no model_call came since" if next_call is None
             else f"its next model_call is at ts {next_call}")
    return (f"{head} ends no task: the session's previous task ended at ts {ended_at} "
            f"and {after}")
