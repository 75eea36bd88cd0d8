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

Pure: no I/O. Works on the trace's columns (``table.EventTable``; a list of
events is turned into one): the events of each name are sorted once, and a
``task_end`` ends a task exactly when the model call or ``task_end`` of its name
just before it is a model call.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agentkv_cluster.sim.trace.table import KINDS, EventTable

if TYPE_CHECKING:
    from agentkv_cluster.sim.trace.table import TraceEvent

_CALL, _END = KINDS.index("model_call"), KINDS.index("task_end")


@dataclass(frozen=True, slots=True)
class StrayTaskEnd:
    """A ``task_end`` that ends no task: ``index`` into the events given."""

    index: int
    session: str
    ts: float
    reason: str


@dataclass(frozen=True, slots=True)
class TaskSplit:
    """``codes[i]``: the task of event ``i``, an index into ``names`` (-1 for a stray
    ``task_end``); ``tasks[i]``: its name (None for a stray)."""

    codes: np.ndarray
    names: tuple[str, ...]
    strays: tuple[StrayTaskEnd, ...]

    @property
    def tasks(self) -> tuple[str | None, ...]:
        return tuple(None if k < 0 else self.names[k] for k in self.codes.tolist())


def split_tasks(events: Sequence[TraceEvent]) -> TaskSplit:
    """The task of every event and every ``task_end`` that ends no task."""
    table = EventTable.from_events(events)
    c = table.columns()
    n = len(table)
    if not n:
        return TaskSplit(codes=np.zeros(0, np.int64), names=(), strays=())
    # each name's events in time order, file order at equal times, task_end last
    order = np.lexsort((c.kind == _END, c.ts, c.session))
    sess, kind = c.session[order], c.kind[order]
    pos = np.arange(n)
    head = np.flatnonzero(np.r_[True, sess[1:] != sess[:-1]])  # first position of a name
    group_start = np.repeat(head, np.diff(np.r_[head, n]))
    relevant = (kind == _CALL) | (kind == _END)
    last = np.maximum.accumulate(np.where(relevant, pos, -1))
    before = np.r_[-1, last[:-1]]  # the nearest call or task_end before each position
    ends = kind == _END
    ok = ends & (before >= group_start) & (kind[np.maximum(before, 0)] == _CALL)
    done = np.cumsum(ok) - ok  # valid task_ends before each position
    number = done - done[group_start]  # 0: the name's first task
    per_name = np.add.reduceat(ok.astype(np.int64), head)
    offset = np.r_[0, np.cumsum(per_name + 1)[:-1]]
    task = np.repeat(offset, np.diff(np.r_[head, n])) + number
    names = _task_names([table.names[k] for k in sess[head].tolist()], per_name.tolist())
    codes = np.empty(n, np.int64)
    codes[order] = np.where(ends & ~ok, -1, task)
    strays = [_stray(table, order, p, group_start[p], kind, ok)
              for p in np.flatnonzero(ends & ~ok).tolist()]
    strays.sort(key=lambda s: s.index)
    return TaskSplit(codes=codes, names=tuple(names), strays=tuple(strays))


def _task_names(sessions: list[str], ended: list[int]) -> list[str]:
    """Every task's name: per session (in order of first appearance), its own name,
    then ``name#2``, ... one after each task_end that ends a task."""
    taken = set(sessions)
    out: list[str] = []
    for name, count in zip(sessions, ended, strict=True):
        out.append(name)
        out.extend(_next_name(name, number, taken) for number in range(2, count + 2))
    return out


def _stray(table: EventTable, order: np.ndarray, p: int, start: int, kind: np.ndarray,
           ok: np.ndarray) -> StrayTaskEnd:
    """The ``task_end`` at sorted position ``p`` (its name's events from ``start``)."""
    i = int(order[p])
    stop = start
    while stop < len(order) and table.session_of(int(order[stop])) == table.session_of(i):
        stop += 1
    group = range(start, stop)
    ended = [table.ts_of(int(order[q])) for q in group if q < p and ok[q]]
    calls = [table.ts_of(int(order[q])) for q in group if kind[q] == _CALL]
    ts = table.ts_of(i)
    k = bisect.bisect_right(calls, ts)
    nxt = calls[k] if k < len(calls) else None
    name = table.session_of(i)
    return StrayTaskEnd(i, name, ts, _why(name, ts, ended[-1] if ended else None, nxt))


def _next_name(name: str, number: int, taken: set[str]) -> str:
    """``name#number``, unique among the trace's names and the tasks named so far."""
    candidate = f"{name}#{number}"
    while candidate in taken:
        candidate += "#"
    taken.add(candidate)
    return candidate


def _why(session: str, ts: float, ended_at: float | None, next_call: float | None) -> str:
    head = f"task_end of session {session!r} at ts {ts}"
    if ended_at is None:
        if next_call is None:
            return f"{head} ends no task: the session has no model_call"
        return f"{head} comes before the session's first model_call (ts {next_call})"
    after = ("no model_call came since" if next_call is None
             else f"its next model_call is at ts {next_call}")
    return (f"{head} ends no task: the session's previous task ended at ts {ended_at} "
            f"and {after}")
