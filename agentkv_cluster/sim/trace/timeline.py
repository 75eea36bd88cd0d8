"""The replay's arithmetic on the trace's columns: tasks, pages, reads, gaps, signals.

``replay.py`` says what is computed (its module doc); this module computes it with
numpy over every event at once, so a trace of millions of requests builds no
object per request, per page or per read. Orders follow the rules stated there:
a task's calls and tools in time order (file order at equal times), all calls by
(time, session name, the call's place in its session), pages by (creation, block).
Sums that Python added left to right (the tools one call waited on) are still
added so where there are several.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.trace.table import KINDS, Columns
from agentkv_cluster.sim.trace.tasks import TaskSplit
from agentkv_cluster.sim.workload import TYPE_ORDER, offsets_of

_CALL, _TOOL, _END = (KINDS.index(k) for k in ("model_call", "tool_start", "task_end"))
_STATES = tuple(StateType)
FIXED = TYPE_ORDER.index(StateType.FIXED_PREFIX)  # what a block read by two sessions is


@dataclass(frozen=True, kw_only=True)
class Tasks:
    """Per task (index into ``names``): its end, first call and whether it has one."""

    names: tuple[str, ...]
    first_call: np.ndarray  # float64; inf without a call
    task_end: np.ndarray  # float64; nan without a task_end
    last_event: np.ndarray  # float64: latest event or tool end

    def with_calls(self) -> list[int]:
        """Tasks with a model call, by (first call, name)."""
        has = np.flatnonzero(np.isfinite(self.first_call)).tolist()
        first = self.first_call.tolist()
        return sorted(has, key=lambda t: (first[t], self.names[t]))

    def ends(self, idle_timeout_s: float) -> np.ndarray:
        """When each task is known to be over: its task_end, else silence timeout."""
        return np.where(np.isnan(self.task_end), self.last_event + idle_timeout_s,
                        self.task_end)


def tasks_of(c: Columns, split: TaskSplit) -> Tasks:
    n = len(split.names)
    task = split.codes
    first = np.full(n, np.inf)
    calls = c.kind == _CALL
    np.minimum.at(first, task[calls], c.ts[calls])
    end = np.full(n, np.nan)
    ends = c.kind == _END
    end[task[ends]] = c.ts[ends]
    last = np.full(n, -np.inf)
    np.maximum.at(last, task, np.where(c.kind == _TOOL, c.ts + c.duration, c.ts))
    np.maximum.at(last, task, c.ts)
    return Tasks(names=split.names, first_call=first, task_end=end, last_event=last)


@dataclass(frozen=True, kw_only=True)
class Calls:
    """The model calls of the replayed tasks in replay order."""

    event: np.ndarray  # index of the call's event
    task: np.ndarray
    ts: np.ndarray
    state: np.ndarray  # int8 into StateType
    after_tool: np.ndarray  # code of the tool started after the call (-1: none)
    after_tool_ts: np.ndarray  # when that tool started (nan: none)
    before_s: np.ndarray  # seconds of the tools the call waited on


def calls_of(c: Columns, split: TaskSplit, tasks: Tasks, chosen: list[int]) -> Calls:
    picked = np.zeros(len(tasks.names), dtype=bool)
    picked[chosen] = True
    task = split.codes
    idx = np.flatnonzero((c.kind == _CALL) & picked[np.maximum(task, 0)] & (task >= 0))
    by_task = idx[np.lexsort((c.ts[idx], task[idx]))]  # each task's calls in time order
    head = np.r_[True, task[by_task][1:] != task[by_task][:-1]]
    place = np.arange(by_task.size) - np.maximum.accumulate(
        np.where(head, np.arange(by_task.size), 0))
    k = np.empty(c.kind.size, np.int64)
    k[by_task] = place
    rank = np.zeros(len(tasks.names), np.int64)
    rank[sorted(chosen, key=lambda t: tasks.names[t])] = np.arange(len(chosen))
    order = idx[np.lexsort((k[idx], rank[task[idx]], c.ts[idx]))]
    state = c.state[order].astype(np.int8)
    default = np.where(k[order] == 0, _STATES.index(StateType.TASK_INPUT),
                       _STATES.index(StateType.TOOL_OBSERVATION))
    after, after_ts, before = _tool_facts(c, task, by_task, picked)
    return Calls(event=order, task=task[order], ts=c.ts[order],
                 state=np.where(state < 0, default, state).astype(np.int8),
                 after_tool=after[order], after_tool_ts=after_ts[order],
                 before_s=before[order])


def _tool_facts(c: Columns, task: np.ndarray, calls: np.ndarray,
                picked: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call event: the tool its task starts after it (the first at or after its
    time, before the task's next later call) and when, and the seconds of the tools
    started since the task's previous earlier call (summed, at most the time between)."""
    tools = np.flatnonzero((c.kind == _TOOL) & (task >= 0) & picked[np.maximum(task, 0)])
    tools = tools[np.lexsort((c.ts[tools], task[tools]))]
    times, rank = np.unique(np.concatenate([c.ts[calls], c.ts[tools]]), return_inverse=True)
    width = times.size + 1
    call_key = task[calls] * width + rank[:calls.size]
    tool_key = task[tools] * width + rank[calls.size:]
    after = np.full(c.kind.size, -1, np.int64)
    after_ts = np.full(c.kind.size, np.nan)
    before = np.zeros(c.kind.size)
    if not calls.size:
        return after, after_ts, before
    # after: the first tool at or after the call, if before the next later call
    i = np.searchsorted(tool_key, call_key, "left")
    nxt = np.searchsorted(call_key, call_key, "right")
    hi = np.where(nxt < calls.size, call_key[np.minimum(nxt, calls.size - 1)], np.iinfo(
        np.int64).max)
    hi = np.where((nxt < calls.size) & (task[calls[np.minimum(nxt, calls.size - 1)]]
                                        == task[calls]), hi, (task[calls] + 1) * width)
    ok = i < tools.size
    ok[ok] &= tool_key[i[ok]] < hi[ok]
    after[calls[ok]] = c.tool[tools[i[ok]]]
    after_ts[calls[ok]] = c.ts[tools[i[ok]]]
    # before: tools in [previous earlier call, this call)
    k = np.searchsorted(call_key, call_key, "left")
    has = (k > 0)
    has[has] &= task[calls[k[has] - 1]] == task[calls[has]]
    lo_key = np.where(has, call_key[np.maximum(k - 1, 0)], 0)
    lo = np.searchsorted(tool_key, lo_key, "left")
    hi_i = np.searchsorted(tool_key, call_key, "left")
    count = np.where(has, hi_i - lo, 0)
    secs = np.zeros(calls.size)
    one = count == 1
    secs[one] = 0.0 + c.duration[tools[lo[one]]]
    dur = c.duration[tools]
    for q in np.flatnonzero(count > 1).tolist():  # several: added in order, as Python did
        secs[q] = sum(dur[lo[q]:hi_i[q]].tolist())
    gap = c.ts[calls] - np.where(has, times[np.maximum(lo_key % width, 0)], 0.0)
    before[calls] = np.where(count > 0, np.minimum(secs, gap), 0.0)
    return after, after_ts, before


@dataclass(frozen=True, kw_only=True)
class Pages:
    """Every KV block of the replayed calls, by (creation, block); each page's reads
    (``read_call``: index into the calls) from ``offsets[p]`` to ``offsets[p + 1]``."""

    block: np.ndarray
    first_call: np.ndarray  # the producing call (index into the calls)
    read_call: np.ndarray
    offsets: np.ndarray


def pages_of(c: Columns, calls: Calls) -> Pages:
    starts, ends = c.starts[calls.event], c.ends[calls.event]
    counts = ends - starts
    pos = np.repeat(np.arange(calls.event.size), counts)
    flat = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    block = c.blocks[np.repeat(starts, counts) + flat]
    order = np.lexsort((pos, block))
    pos, block = pos[order], block[order]
    keep = np.r_[True, (block[1:] != block[:-1]) | (pos[1:] != pos[:-1])][:block.size]
    pos, block = pos[keep], block[keep]  # a block once per call
    head = np.r_[True, block[1:] != block[:-1]][:block.size]
    group = np.cumsum(head) - 1
    first = pos[head]
    page_order = np.lexsort((block[head], calls.ts[first]))
    page_of_group = np.empty(page_order.size, np.int64)
    page_of_group[page_order] = np.arange(page_order.size)
    reads = ~head
    read_page = page_of_group[group[reads]]
    read_pos = pos[reads]
    by = np.lexsort((read_pos, read_page))
    n_reads = np.bincount(read_page, minlength=page_order.size)
    return Pages(block=block[head][page_order], first_call=first[page_order],
                 read_call=read_pos[by],
                 offsets=offsets_of(n_reads))


def page_types(pages: Pages, calls: Calls) -> tuple[np.ndarray, np.ndarray]:
    """Each block's type as produced (its producer's state) and when it becomes
    FIXED_PREFIX: at the first read by another session (inf: never). No lookahead: a
    block is not a shared prefix before a second session has read it."""
    owner = calls.task[pages.first_call]
    n = pages.block.size
    page = np.repeat(np.arange(n), np.diff(pages.offsets))
    other = calls.task[pages.read_call] != owner[page]
    shared_at = np.full(n, np.inf)
    np.minimum.at(shared_at, page[other], calls.ts[pages.read_call[other]])
    state = np.array([TYPE_ORDER.index(s) for s in _STATES], np.int8)[
        calls.state[pages.first_call]]
    return state, shared_at


def signal_times(pages: Pages, calls: Calls, ends: np.ndarray) -> np.ndarray:
    """When every session that held the block up to then has ended (no lookahead):
    walk the holders in order of first use; the signal is the first moment the
    holders seen so far are all over before the next holder appears."""
    owner = calls.task[pages.first_call]
    eol = ends[owner].astype(np.float64)
    n = pages.block.size
    page = np.repeat(np.arange(n), np.diff(pages.offsets))
    reader = calls.task[pages.read_call]
    many = np.flatnonzero(np.bincount(page[reader != owner[page]], minlength=n) > 0)
    offsets, read_call = pages.offsets.tolist(), pages.read_call
    for p in many.tolist():
        seen = {int(owner[p])}
        done = float(ends[owner[p]])
        for q in read_call[offsets[p]:offsets[p + 1]].tolist():
            s = int(calls.task[q])
            if s in seen:
                continue
            seen.add(s)
            if float(calls.ts[q]) > done:
                break  # all earlier holders had ended: the orchestrator said so then
            done = max(done, float(ends[s]))
        eol[p] = done
    return eol


@dataclass(frozen=True, kw_only=True)
class Gaps:
    """Every page's idle gaps, end to end: page ``p``'s slots run from ``offsets[p]``
    (``head[p]``: the gap before its first read, or its tail when it has none) to
    ``offsets[p + 1]``; slot k ends in read k, the last is the tail after the last."""

    read_ts: np.ndarray  # every read's time, page after page
    true: np.ndarray  # per slot: the true gap (the tail: a typical one), >= 1 ms
    labels: np.ndarray  # per slot: code into ``names`` of the tool that runs in it
    secs: np.ndarray  # per slot: that tool's own seconds (0: unknown)
    starts: np.ndarray  # per slot: when that tool started (nan: no tool, or unknown)
    offsets: np.ndarray
    head: np.ndarray
    names: tuple[str, ...]


def gaps_of(pages: Pages, calls: Calls, names: tuple[str, ...]) -> Gaps:
    n = pages.block.size
    counts = np.diff(pages.offsets)
    page = np.repeat(np.arange(n), counts)
    created = calls.ts[pages.first_call]
    read_ts = calls.ts[pages.read_call]
    prev = np.r_[np.nan, read_ts[:-1]] if read_ts.size else read_ts
    prev[pages.offsets[:-1][counts > 0]] = created[counts > 0]
    gaps = read_ts - prev
    # After the last read there is no true gap to add noise to, and the time to the
    # signal (an idle timeout away) would tell the predictor the page is dead: the
    # guess is a typical gap instead (the page's own median so far, else the trace's).
    typical = float(np.median(gaps)) if gaps.size else 1.0
    tail = np.full(n, typical)
    ranked = gaps[np.lexsort((gaps, page))]
    has = counts > 0
    mid = pages.offsets[:-1][has] + counts[has] // 2
    even = counts[has] % 2 == 0
    tail[has] = np.where(even, (ranked[np.maximum(mid - 1, 0)] + ranked[mid]) / 2, ranked[mid])
    head = pages.offsets[:-1] + np.arange(n)
    slot = np.arange(read_ts.size) + page  # read j's gap
    true = np.empty(read_ts.size + n)
    true[slot], true[head + counts] = gaps, tail
    # each gap's label: the tool its opening session starts right after the call that
    # opened it (known at the gap's start); its duration: what the reading call waited
    # on (learned only at the read)
    labels = np.empty(read_ts.size + n, np.int32)
    labels[head] = calls.after_tool[pages.first_call]
    labels[slot + 1] = calls.after_tool[pages.read_call]
    labels[labels < 0] = len(names)
    starts = np.empty(read_ts.size + n)  # the labelled tool's start: a fact once it is past
    starts[head] = calls.after_tool_ts[pages.first_call]
    starts[slot + 1] = calls.after_tool_ts[pages.read_call]
    secs = np.zeros(read_ts.size + n)
    secs[slot] = calls.before_s[pages.read_call]
    return Gaps(read_ts=read_ts, true=np.maximum(true, 1e-3), labels=labels, secs=secs,
                starts=starts, offsets=pages.offsets + np.arange(n + 1), head=head,
                names=(*names, ""))
