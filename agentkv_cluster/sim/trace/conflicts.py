"""Trace events that contradict an earlier event of the same trace.

- A ``tool_start`` that repeats an earlier one exactly (same session, time, tool class
  and a duration > 0) is a duplicated line: read as a second tool it would add its
  duration again to the gap before the session's next call (``replay`` sums the
  tools a call waited on). One of 0 s adds nothing and is
  kept: the Mooncake converter gives two requests of one conversation in the same
  millisecond a 0-s ``think`` each.
- A ``model_call`` that gives a block id another ``block_tokens`` than an earlier call
  did: equal ids are the same KV, so one block has one size, and the replay would
  silently take the first call's.

The earlier event (in the order given: file order for a parsed trace) is kept and
the later one refused with the session, the block and the earlier event's place.
Pure: no I/O. Works on the trace's columns (``table.EventTable``; a list of events
is turned into one): repeated tools are found by sorting, and blocks are looked at
one by one only when the trace gives two sizes at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agentkv_cluster.sim.trace.table import KINDS, EventTable

if TYPE_CHECKING:
    from agentkv_cluster.sim.trace.table import TraceEvent

_CALL, _TOOL = KINDS.index("model_call"), KINDS.index("tool_start")


@dataclass(frozen=True, slots=True)
class Conflict:
    """Event ``index`` (into the events given) contradicts an earlier event."""

    index: int
    reason: str


def find_conflicts(events: Sequence[TraceEvent],
                   lines: Sequence[int] | None = None) -> tuple[Conflict, ...]:
    """Every event that repeats an earlier ``tool_start`` or resizes an earlier block.
    ``lines[i]`` is event ``i``'s 1-based line, used to name the earlier event
    (without it, its 1-based position among the events)."""
    def where(i: int) -> str:
        return f"line {lines[i]}" if lines is not None else f"event {i + 1}"

    table = EventTable.from_events(events)
    out = [Conflict(i, (
        f"tool_start of session {table.session_of(i)!r} at ts {table.ts_of(i)} "
        f"({table.tool_of(i)}, {table.duration_of(i)} s) repeats {where(first)}: a "
        f"duplicated line would add its duration twice to the gap before the next call"))
        for i, first in _repeated_tools(table)]
    out += _resized_blocks(table, where)
    return tuple(sorted(out, key=lambda c: c.index))


def _repeated_tools(table: EventTable) -> list[tuple[int, int]]:
    """(index, index of the first equal one) of every tool_start with a duration > 0
    that repeats an earlier one in session, time, class and duration."""
    c = table.columns()
    idx = np.flatnonzero((c.kind == _TOOL) & (c.duration > 0))
    if idx.size < 2:
        return []
    keys = (c.duration[idx], c.tool[idx], c.ts[idx], c.session[idx])
    order = idx[np.lexsort(keys)]  # stable: equal tools stay in event order
    same = np.ones(order.size, dtype=bool)
    same[0] = False
    for col in (c.session, c.ts, c.tool, c.duration):
        same[1:] &= col[order[1:]] == col[order[:-1]]
    if not same.any():
        return []
    first = order[np.maximum.accumulate(np.where(same, 0, np.arange(order.size)))]
    return [(int(i), int(f)) for i, f in zip(order[same], first[same], strict=True)]


def _resized_blocks(table: EventTable, where) -> list[Conflict]:
    """Every model_call giving a block another size than the call that sized it."""
    c = table.columns()
    calls = np.flatnonzero(c.kind == _CALL)
    if np.unique(c.block_tokens[calls]).size < 2:
        return []  # one size throughout: nothing to contradict
    sizes: dict[int, int] = {}  # block id -> index of the call that sized it first
    out: list[Conflict] = []
    for i in calls.tolist():
        blocks, tokens = table.blocks_of(i), table.block_tokens_of(i)
        clash = next((b for b in blocks if b in sizes
                      and table.block_tokens_of(sizes[b]) != tokens), None)
        if clash is not None:
            first = sizes[clash]
            out.append(Conflict(i, (
                f"model_call of session {table.session_of(i)!r} at ts {table.ts_of(i)} gives "
                f"block {clash} block_tokens {tokens}, but {where(first)} (session "
                f"{table.session_of(first)!r}) gave it {table.block_tokens_of(first)}: one "
                f"block id is one KV block of one size")))
            continue
        for b in blocks:
            sizes.setdefault(b, i)
    return out
