"""Trace events that contradict an earlier event of the same trace.

- A ``tool_start`` that repeats an earlier one exactly (same session, time, tool class
  and a duration > 0) is a duplicated line: read as a second tool it would add its
  duration again to the gap before the session's next call (``replay._Session
  .tool_before`` sums the tools a call waited on). One of 0 s adds nothing and is
  kept: the Mooncake converter gives two requests of one conversation in the same
  millisecond a 0-s ``think`` each.
- A ``model_call`` that gives a block id another ``block_tokens`` than an earlier call
  did: equal ids are the same KV, so one block has one size, and the replay would
  silently take the first call's.

The earlier event (in the order given: file order for a parsed trace) is kept and
the later one refused with the session, the block and the earlier event's place.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv_cluster.sim.trace.format import TraceEvent


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

    tools: dict[tuple[str, float, str, float], int] = {}
    sizes: dict[int, int] = {}  # block id -> index of the call that sized it first
    out: list[Conflict] = []
    for i, e in enumerate(events):
        if e.kind == "tool_start" and e.tool_duration_s > 0:
            key = (e.session, e.ts, e.tool_class, e.tool_duration_s)
            first = tools.setdefault(key, i)
            if first != i:
                out.append(Conflict(i, (
                    f"tool_start of session {e.session!r} at ts {e.ts} ({e.tool_class}, "
                    f"{e.tool_duration_s} s) repeats {where(first)}: a duplicated line "
                    f"would add its duration twice to the gap before the next call")))
        elif e.kind == "model_call":
            clash = next((b for b in e.prefix_blocks if b in sizes
                          and events[sizes[b]].block_tokens != e.block_tokens), None)
            if clash is not None:
                other = events[sizes[clash]]
                out.append(Conflict(i, (
                    f"model_call of session {e.session!r} at ts {e.ts} gives block {clash} "
                    f"block_tokens {e.block_tokens}, but {where(sizes[clash])} (session "
                    f"{other.session!r}) gave it {other.block_tokens}: one block id is one "
                    f"KV block of one size")))
                continue
            for b in e.prefix_blocks:
                sizes.setdefault(b, i)
    return tuple(out)
