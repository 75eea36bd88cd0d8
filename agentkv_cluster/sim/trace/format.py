"""The AgentKV trace format: JSON lines of agent workflow events.

One object per line::

    {"session": "s1", "ts": 0.0, "kind": "model_call", "tokens": 6758,
     "prefix_blocks": [0, 1, 2], "state": "task_input"}
    {"session": "s1", "ts": 0.4, "kind": "tool_start", "tool_class": "search",
     "tool_duration_s": 4.2}
    {"session": "s1", "ts": 4.6, "kind": "observation_return", "tokens": 1200}
    {"session": "s1", "ts": 9.0, "kind": "task_end"}

- ``session`` (str, required), ``ts`` (seconds, number >= 0, required),
  ``kind`` (required): ``model_call`` | ``tool_start`` | ``observation_return`` | ``task_end``.
- ``model_call``: ``tokens`` (int >= 0, context length) and ``prefix_blocks``
  (list of int): the KV blocks of the whole context in order, ``block_tokens``
  tokens each; equal ids are the same reusable KV (shared prefixes). Optional
  ``state``: the lifecycle type of the blocks this call introduces.
- ``tool_start``: ``tool_class`` (str) and ``tool_duration_s`` (number >= 0).
- ``observation_return``: optional ``tokens``.
- Optional everywhere: ``block_tokens`` (int > 0, default 512).

Numbers must be finite: times and durations at most ``MAX_SECONDS`` (about 31,700
years: anything larger is a unit mistake), token counts at most ``MAX_TOKENS``
(more than any model's context). Every line that is not a valid event is reported
with its 1-based line number; nothing is dropped silently. A session name may be
reused: its ``task_end`` closes one task and its next event starts another; a
``task_end`` before every model call of its task ends nothing and is a line error
(``tasks.py``), and so are a ``tool_start`` repeated exactly (duration > 0) and a
block id given another ``block_tokens`` than before (``conflicts.py``). A UTF-8
byte-order mark is ignored and a gzip-compressed file is read as its text. A line
that is not UTF-8 is a line error (its bytes are never replaced: two names would
become one); a file none of whose lines is UTF-8 is a ``TraceFormatError``.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.trace.conflicts import find_conflicts
from agentkv_cluster.sim.trace.table import DEFAULT_BLOCK_TOKENS, KINDS, EventTable, TraceEvent
from agentkv_cluster.sim.trace.tasks import split_tasks

__all__ = ["DEFAULT_BLOCK_TOKENS", "KINDS", "EventTable", "LineError", "ParseResult",
           "TraceEvent", "TraceFormatError", "open_lines", "parse_lines", "read_trace",
           "undecodable", "write_trace"]

MAX_SECONDS = 1e12  # ~31,700 years: a larger time or duration is a unit mistake
MAX_TOKENS = 100_000_000  # more tokens than any model's context window
_GZIP_MAGIC = b"\x1f\x8b"
PROGRESS_LINES = 65_536  # a reader reports its progress every this many lines
LineProgress = Callable[[int], None]  # told of the number of lines just read
_STATES = {t.value: t for t in StateType}
# Bytes that are not UTF-8, as ``errors="surrogateescape"`` decodes them.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
# UTF-32 LE starts like UTF-16 LE; both are refused alike.
_WIDE_BOMS = ("\udcff\udcfe", "\udcfe\udcff", "\x00\x00\udcfe\udcff")


class TraceFormatError(ValueError):
    """A trace cannot be used at all (missing file, nothing valid in it)."""


@dataclass(frozen=True, slots=True)
class LineError:
    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(kw_only=True)
class ParseResult:
    """Valid events in file order (as columns: ``table.py``) plus every rejected line."""

    events: EventTable = field(default_factory=EventTable)
    errors: list[LineError] = field(default_factory=list)
    lines: int = 0


class _Bad(Exception):
    pass


def _number(d: dict, key: str, *, required: bool, minimum: float = 0.0,
            maximum: float = MAX_SECONDS) -> float:
    if key not in d:
        if required:
            raise _Bad(f"missing field {key!r}")
        return 0.0
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"field {key!r} must be a finite number, got {v!r}")
    try:
        v = float(v)
    except OverflowError:  # an integer literal beyond any float
        v = math.inf
    if not math.isfinite(v):
        raise _Bad(f"field {key!r} must be a finite number, got {v!r}")
    if v < minimum:
        raise _Bad(f"field {key!r} must be >= {minimum}, got {v!r}")
    if v > maximum:
        raise _Bad(f"field {key!r} must be <= {maximum:g} s, got {v!r}")
    return float(v)


def _int(d: dict, key: str, *, required: bool, minimum: int = 0, default: int = 0,
         maximum: int = MAX_TOKENS) -> int:
    if key not in d:
        if required:
            raise _Bad(f"missing field {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(f"field {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise _Bad(f"field {key!r} must be >= {minimum}, got {v!r}")
    if v > maximum:
        raise _Bad(f"field {key!r} must be <= {maximum:,}, got {v!r}")
    return v


def event_from_dict(d: Any) -> TraceEvent:
    """Validate one decoded line; raises ``_Bad`` with the reason."""
    if not isinstance(d, dict):
        raise _Bad(f"expected a JSON object, got {type(d).__name__}")
    session = d.get("session")
    if not isinstance(session, str) or not session:
        raise _Bad("field 'session' must be a non-empty string")
    kind = d.get("kind")
    if kind not in KINDS:
        raise _Bad(f"unknown event kind {kind!r} (expected one of {', '.join(KINDS)})")
    ts = _number(d, "ts", required=True)
    block_tokens = _int(d, "block_tokens", required=False, minimum=1,
                        default=DEFAULT_BLOCK_TOKENS)
    if kind == "model_call":
        blocks = d.get("prefix_blocks")
        if not isinstance(blocks, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in blocks):
            raise _Bad("field 'prefix_blocks' must be a list of integers")
        state = d.get("state")
        if state is not None and state not in _STATES:
            raise _Bad(f"unknown state {state!r}")
        return TraceEvent(session=session, ts=ts, kind=kind,
                          tokens=_int(d, "tokens", required=True),
                          prefix_blocks=tuple(blocks), block_tokens=block_tokens,
                          state=_STATES[state] if state is not None else None)
    if kind == "tool_start":
        tool = d.get("tool_class")
        if not isinstance(tool, str) or not tool:
            raise _Bad("field 'tool_class' must be a non-empty string")
        return TraceEvent(session=session, ts=ts, kind=kind, tool_class=tool,
                          tool_duration_s=_number(d, "tool_duration_s", required=True),
                          block_tokens=block_tokens)
    return TraceEvent(session=session, ts=ts, kind=kind, block_tokens=block_tokens,
                      tokens=_int(d, "tokens", required=False))


def parse_lines(lines: Iterable[str]) -> ParseResult:
    """Parse AgentKV trace lines; blank lines are skipped, bad ones reported, and so are
    a line that contradicts an earlier one (a repeated ``tool_start``, a block resized:
    ``sim/trace/conflicts.py``) and a ``task_end`` that ends no task
    (``sim/trace/tasks.py``)."""
    out = ParseResult()
    numbers = array("q")  # each event's line
    for no, raw in enumerate(lines, start=1):
        out.lines = no
        if not raw.strip():
            continue
        bad_bytes = undecodable(raw)
        if bad_bytes is not None:
            out.errors.append(LineError(no, bad_bytes))
            continue
        try:
            out.events.append(event_from_dict(json.loads(raw)))
            numbers.append(no)
        except json.JSONDecodeError as exc:
            out.errors.append(LineError(no, f"invalid JSON ({exc.msg})"))
        except _Bad as exc:
            out.errors.append(LineError(no, str(exc)))
    conflicts = find_conflicts(out.events, numbers)
    if conflicts:
        refused = {c.index for c in conflicts}
        out.errors.extend(LineError(numbers[c.index], c.reason) for c in conflicts)
        out.events = out.events.keep(i for i in range(len(out.events)) if i not in refused)
        numbers = array("q", (n for i, n in enumerate(numbers) if i not in refused))
    strays = split_tasks(out.events).strays
    if strays:
        refused = {s.index for s in strays}
        out.errors.extend(LineError(numbers[s.index], s.reason) for s in strays)
        out.events = out.events.keep(i for i in range(len(out.events)) if i not in refused)
    out.errors.sort(key=lambda e: e.line)
    return out


def read_trace(path: Path, progress: LineProgress | None = None) -> ParseResult:
    return parse_lines(open_lines(path, progress=progress))


def write_trace(events: Iterable[TraceEvent], path: Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e.to_dict(), separators=(",", ":")) + "\n")
            n += 1
    return n


def undecodable(raw: str) -> str | None:
    """Why a line from ``open_lines`` is not UTF-8 text (None when it is): the bytes
    that do not decode reach it as lone surrogates, never as a replacement character
    that would make two different names one."""
    where = _bad_byte(raw)
    return None if where is None else f"not UTF-8 text ({where}); a trace must be UTF-8"


def _bad_byte(raw: str) -> str | None:
    bad = _UNDECODABLE.search(raw)
    if bad is None:
        return None
    return f"byte 0x{ord(bad.group()) - 0xDC00:02x} at character {bad.start() + 1}"


def open_lines(path: Path, newline: str | None = None,
               progress: LineProgress | None = None) -> Iterator[str]:
    """The text lines of ``path`` (UTF-8, a byte-order mark dropped, gzip unpacked);
    an unreadable file is a ``TraceFormatError`` naming it. Bytes that are not UTF-8
    reach the caller as lone surrogates, for ``undecodable`` to report the line; a file
    none of whose lines is UTF-8 (or one that starts with a UTF-16 or UTF-32 byte-order
    mark) is a ``TraceFormatError``. ``progress(n)`` is told of the lines read, every
    ``PROGRESS_LINES`` lines and once at the end."""
    try:
        with open(path, "rb") as probe:
            packed = probe.read(2) == _GZIP_MAGIC
        opener = gzip.open if packed else open
        with opener(path, "rt", encoding="utf-8-sig", errors="surrogateescape",
                    newline=newline) as fh:
            no = text = bad = 0
            first_bad = ""
            for no, line in enumerate(fh, start=1):
                if line.strip():
                    text += 1
                    if _UNDECODABLE.search(line):
                        if text == 1 and line.startswith(_WIDE_BOMS):
                            raise TraceFormatError(
                                f"cannot read trace {path}: it is UTF-16 or UTF-32 text "
                                f"(its byte-order mark says so), not UTF-8")
                        bad += 1
                        first_bad = first_bad or f"line {no}, {_bad_byte(line)}"
                yield line
                if progress is not None and no % PROGRESS_LINES == 0:
                    progress(PROGRESS_LINES)
            if progress is not None and no % PROGRESS_LINES:
                progress(no % PROGRESS_LINES)
            if bad and bad == text:  # not one line of text: one error, not a line each
                raise TraceFormatError(f"cannot read trace {path}: it is not UTF-8 text "
                                       f"(none of its {text:,} lines decodes; first: "
                                       f"{first_bad}); convert the file to UTF-8")
    except (OSError, EOFError, zlib.error) as exc:  # gzip: damaged or truncated
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TraceFormatError(f"cannot read trace {path}: {reason}") from None
