"""Trace events held as columns: a few bytes per event instead of one object each.

A parsed trace used to be a list of ``TraceEvent`` objects: with its tuple of block
ids and their int objects, about 700 bytes per Mooncake request, held for the whole run (a
sweep replays the same events at every point). ``EventTable`` keeps one typed
array per field (``array.array``, so it grows one event at a time while a file is
read) and the block ids of every model call end to end, with each call's offset::

    kind   int8      ts        float64    session  int32 -> names
    tokens int64     block_tokens int64   tool     int32 -> names
    state  int8 (-1: none)      duration float64
    blocks int64 (all calls' ids, end to end)   ends int64 (per event: its last + 1)

Session and tool names are stored once each. It is a ``Sequence[TraceEvent]``: an
event is built only when asked for (``table[i]``, iteration), so readers of events
keep working. ``columns()`` hands the replay numpy views of the arrays, no copy.

``TraceEvent`` (one event) lives here too, with the table that stores it.
Block ids beyond int64 (JSON integers have no bound) switch the block column to a
plain list, once, so nothing is refused that a list of events accepted; the
replay then uses the ids' ranks, which keep their order and identity.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from agentkv_cluster.lifecycle.types import StateType

KINDS = ("model_call", "tool_start", "observation_return", "task_end")
DEFAULT_BLOCK_TOKENS = 512
_STATES: tuple[StateType, ...] = tuple(StateType)
_STATE_CODE = {s: k for k, s in enumerate(_STATES)}
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}


@dataclass(frozen=True, kw_only=True)
class TraceEvent:
    """One event of the AgentKV trace format (``format.py``)."""

    session: str
    ts: float
    kind: str
    tokens: int = 0
    prefix_blocks: tuple[int, ...] = ()
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    tool_class: str = ""
    tool_duration_s: float = 0.0
    state: StateType | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"session": self.session, "ts": self.ts, "kind": self.kind}
        if self.kind == "model_call":
            d["tokens"] = self.tokens
            d["prefix_blocks"] = list(self.prefix_blocks)
            if self.state is not None:
                d["state"] = self.state.value
        elif self.kind == "tool_start":
            d["tool_class"] = self.tool_class
            d["tool_duration_s"] = self.tool_duration_s
        elif self.kind == "observation_return" and self.tokens:
            d["tokens"] = self.tokens
        if self.block_tokens != DEFAULT_BLOCK_TOKENS:
            d["block_tokens"] = self.block_tokens
        return d


@dataclass(frozen=True, kw_only=True)
class Columns:
    """Numpy views of an ``EventTable`` (event ``i``'s blocks:
    ``blocks[starts[i]:ends[i]]``; ``blocks`` are ranks when the ids overflow int64)."""

    kind: np.ndarray
    ts: np.ndarray
    session: np.ndarray
    tokens: np.ndarray
    block_tokens: np.ndarray
    tool: np.ndarray
    duration: np.ndarray
    state: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    blocks: np.ndarray
    names: tuple[str, ...]  # session and tool names, by code


class EventTable(Sequence[TraceEvent]):
    """Trace events in file order, as columns (module doc)."""

    def __init__(self) -> None:
        self._kind = array("b")
        self._ts = array("d")
        self._session = array("i")
        self._tokens = array("q")
        self._block_tokens = array("q")
        self._tool = array("i")
        self._duration = array("d")
        self._state = array("b")
        self._ends = array("q")
        self._blocks: array | list[int] = array("q")
        self._names: list[str] = []
        self._codes: dict[str, int] = {}

    @classmethod
    def from_events(cls, events: Iterable[TraceEvent]) -> EventTable:
        if isinstance(events, EventTable):
            return events
        table = cls()
        for e in events:
            table.append(e)
        return table

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
        return code

    def append(self, e: TraceEvent) -> None:
        self._kind.append(_KIND_CODE[e.kind])
        self._ts.append(e.ts)
        self._session.append(self._code(e.session))
        self._tokens.append(e.tokens)
        self._block_tokens.append(e.block_tokens)
        self._tool.append(self._code(e.tool_class))
        self._duration.append(e.tool_duration_s)
        self._state.append(-1 if e.state is None else _STATE_CODE[e.state])
        start = self._ends[-1] if self._ends else 0
        try:
            self._blocks.extend(e.prefix_blocks)
        except OverflowError:  # an id beyond int64: keep them all as Python ints
            self._blocks = list(self._blocks[:start])
            self._blocks.extend(e.prefix_blocks)
        self._ends.append(len(self._blocks))

    def __len__(self) -> int:
        return len(self._kind)

    @overload
    def __getitem__(self, i: int) -> TraceEvent: ...
    @overload
    def __getitem__(self, i: slice) -> list[TraceEvent]: ...
    def __getitem__(self, i: int | slice) -> TraceEvent | list[TraceEvent]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("event index out of range")
        state = self._state[i]
        return TraceEvent(
            session=self._names[self._session[i]], ts=self._ts[i], kind=KINDS[self._kind[i]],
            tokens=self._tokens[i], prefix_blocks=tuple(self._blocks[self.start(i):self._ends[i]]),
            block_tokens=self._block_tokens[i], tool_class=self._names[self._tool[i]],
            tool_duration_s=self._duration[i], state=None if state < 0 else _STATES[state])

    def __iter__(self) -> Iterator[TraceEvent]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"EventTable({len(self)} events)"

    @property
    def names(self) -> list[str]:
        """Session and tool names, by code (each stored once)."""
        return self._names

    def block_tokens_of(self, i: int) -> int:
        return self._block_tokens[i]

    def tool_of(self, i: int) -> str:
        return self._names[self._tool[i]]

    def duration_of(self, i: int) -> float:
        return self._duration[i]

    def start(self, i: int) -> int:
        return self._ends[i - 1] if i else 0

    def session_of(self, i: int) -> str:
        return self._names[self._session[i]]

    def kind_of(self, i: int) -> str:
        return KINDS[self._kind[i]]

    def blocks_of(self, i: int) -> Sequence[int]:
        return self._blocks[self.start(i):self._ends[i]]

    def ts_of(self, i: int) -> float:
        return self._ts[i]

    def keep(self, indices: Iterable[int]) -> EventTable:
        """A new table of the events at ``indices``, in that order."""
        out = EventTable()
        for i in indices:
            out.append(self[i])
        return out

    def columns(self) -> Columns:
        """Numpy views of the columns (valid until the next ``append``)."""
        ends = _view(self._ends, np.int64)
        if isinstance(self._blocks, list):
            blocks = _ranks(self._blocks)
        else:
            blocks = _view(self._blocks, np.int64)
        return Columns(
            kind=_view(self._kind, np.int8), ts=_view(self._ts, np.float64),
            session=_view(self._session, np.int32), tokens=_view(self._tokens, np.int64),
            block_tokens=_view(self._block_tokens, np.int64), tool=_view(self._tool, np.int32),
            duration=_view(self._duration, np.float64), state=_view(self._state, np.int8),
            starts=np.concatenate([np.zeros(1, np.int64), ends[:-1]]) if len(ends) else ends,
            ends=ends, blocks=blocks, names=tuple(self._names))


def _view(a: array, dtype: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype)


def _ranks(ids: list[int]) -> np.ndarray:
    """Each id's rank among the distinct ids: equal ids equal, order kept."""
    order = {b: k for k, b in enumerate(sorted(set(ids)))}
    return np.fromiter((order[b] for b in ids), dtype=np.int64, count=len(ids))
