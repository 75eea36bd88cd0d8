"""Converters from public traces (``../shared/traces``) to the AgentKV trace format.

- Mooncake FAST'25 (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids``): ``hash_ids`` are 512-token prefix blocks and become shared
  prefix pages. A request that extends the whole context of an earlier request
  continues that conversation; every request starts a ``think`` tool gap at its
  own time (its length is the time to the conversation's next request, 0 after
  the last one: a conversation's last turn looks like any other when it ends). No ``task_end`` is invented: the trace does not say
  which turn is a conversation's last, so the replay ends a silent session by
  its idle timeout.
- Azure LLM inference 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``): no
  session or prefix information, so each request is its own one-call session
  with fresh blocks (the replay then has nothing to reuse; it shows only
  capacity pressure). Its timestamps carry no zone and are read as UTC.
- TraceLab round traces (Claude Code / Codex): ``prefix_tokens`` of each round
  are kept blocks of the previous context, ``newly_append_tokens`` new blocks,
  ``tools[*].tool_wall_latency_ms`` real tool gaps (a negative, missing or null
  latency, or a tool that is not an object, rejects the round, with its line
  number); a round whose ``round_id`` (else ``round_index``) repeats one of its
  session's earlier rounds is the same round twice and is rejected too, and so is a
  ``session_id`` that is not a non-empty string. Each session's blocks get ids of
  their own, never another session's (``SESSION_ID_SPAN``). No ``task_end`` either.
  Timestamps without a zone are read as UTC (those with one keep it), so the
  result does not depend on the machine's time zone.

Every converter returns a ``ParseResult``; source lines it cannot use are
reported with their line number.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.trace.format import (
    DEFAULT_BLOCK_TOKENS,
    MAX_SECONDS,
    MAX_TOKENS,
    EventTable,
    LineError,
    LineProgress,
    ParseResult,
    TraceEvent,
    TraceFormatError,
    open_lines,
    read_trace,
    undecodable,
)

FORMATS = ("agentkv", "mooncake", "azure", "tracelab")


def _json_lines(path: Path, out: ParseResult,
                progress: LineProgress | None) -> Iterator[tuple[int, Any]]:
    for no, raw in enumerate(open_lines(path, progress=progress), start=1):
        out.lines = no
        if not raw.strip():
            continue
        bad_bytes = undecodable(raw)
        if bad_bytes is not None:
            out.errors.append(LineError(no, bad_bytes))
            continue
        try:
            yield no, json.loads(raw)
        except json.JSONDecodeError as exc:
            out.errors.append(LineError(no, f"invalid JSON ({exc.msg})"))


def _seconds(value: float, what: str) -> float:
    """A time in seconds: finite, >= 0 and at most MAX_SECONDS (else a unit mistake)."""
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise ValueError(f"{what} must be finite, >= 0 and <= {MAX_SECONDS:g} s, got {value!r}")
    return value


def _tokens(value: int, what: str) -> int:
    if not 0 <= value <= MAX_TOKENS:
        raise ValueError(f"{what} must be in [0, {MAX_TOKENS:,}], got {value!r}")
    return value


def _need(d: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(d, dict):
        raise TypeError(f"expected a JSON object, got {type(d).__name__}")
    if key not in d:
        raise ValueError(f"missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise TypeError(f"field {key!r} has the wrong type ({type(v).__name__})")
    return v


class _Conversations:
    """Groups Mooncake requests: a request continues the conversation whose latest
    context it extends (all but possibly its last, partial block)."""

    def __init__(self) -> None:
        self._owner: dict[int, int] = {}  # block id -> conversation of its latest use
        self._last_len: dict[int, int] = {}  # conversation -> blocks in its latest request
        self._next = 0

    def assign(self, blocks: list[int]) -> tuple[int, bool]:
        deepest = -1
        for i in range(len(blocks) - 1, -1, -1):
            if blocks[i] in self._owner:
                deepest = i
                break
        conv = self._owner.get(blocks[deepest]) if deepest >= 1 else None
        new = conv is None or self._last_len[conv] - 1 > deepest + 1
        if new:
            conv, self._next = self._next, self._next + 1
        for b in blocks:
            self._owner[b] = conv
        self._last_len[conv] = len(blocks)
        return conv, new


def convert_mooncake(path: Path, progress: LineProgress | None = None) -> ParseResult:
    out = ParseResult()
    convs = _Conversations()
    last: dict[int, float] = {}  # conversation -> ts of its latest request
    rows: list[tuple[float, int, list[int]]] = []
    for no, d in _json_lines(path, out, progress):
        try:
            ms = _need(d, "timestamp", (int, float))
            tokens = _need(d, "input_length", int)
            blocks = _need(d, "hash_ids", list)
            if ms < 0 or tokens < 0:
                raise ValueError("timestamp and input_length must be >= 0")
            try:
                ts = _seconds(ms / 1000.0, "timestamp / 1000")
            except OverflowError:  # an integer beyond any float
                raise ValueError(f"timestamp must be <= {MAX_SECONDS * 1000:g} ms, got an "
                                 f"integer of {len(str(ms))} digits") from None
            _tokens(tokens, "input_length")
            if not blocks or not all(isinstance(b, int) and not isinstance(b, bool)
                                     for b in blocks):
                raise ValueError("hash_ids must be a non-empty list of integers")
        except (ValueError, TypeError, OverflowError) as exc:
            out.errors.append(LineError(no, str(exc)))
            continue
        rows.append((ts, tokens, blocks))
    # Turns join conversations in time order, whatever the file's order (stable: equal
    # timestamps keep the file's order).
    for ts, tokens, blocks in sorted(rows, key=lambda r: r[0]):
        conv, new = convs.assign(blocks)
        session = f"conv-{conv}"
        if not new:  # the time since the previous turn is a think / tool gap
            prev = last[conv]
            out.events.append(TraceEvent(session=session, ts=prev, kind="tool_start",
                                         tool_class="think", tool_duration_s=max(0.0, ts - prev)))
        out.events.append(TraceEvent(
            session=session, ts=ts, kind="model_call", tokens=tokens, prefix_blocks=tuple(blocks),
            state=StateType.TASK_INPUT if new else StateType.TOOL_OBSERVATION))
        last[conv] = ts
    # A reply is always followed by the user's think time, the last one too: whether a
    # conversation comes back is not known when its turn ends, so every turn gets its
    # think gap (the last one's length is unknown: 0, and no call waits on it).
    for conv, ts in last.items():
        out.events.append(TraceEvent(session=f"conv-{conv}", ts=ts, kind="tool_start",
                                     tool_class="think", tool_duration_s=0.0))
    return out


def _utc_seconds(moment: datetime) -> float:
    """Seconds since the epoch; a time without a zone is UTC, never the machine's zone
    (which would make results depend on TZ and on its daylight-saving jumps)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _azure_time(text: str) -> float:
    # Seven fractional digits: datetime takes at most six. The fraction is digits only:
    # float() would also take "1e5" (10,000 s later) or "-5".
    head, _, frac = text.strip().partition(".")
    try:
        base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ValueError(f"TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'") from None
    if frac and not (frac.isascii() and frac.isdigit()):
        raise ValueError(f"TIMESTAMP {text!r}: the fraction of a second must be digits")
    return _utc_seconds(base) + (float("0." + frac) if frac else 0.0)


def _azure_int(text: str, column: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{column} must be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{column} must be >= 0, got {value}")
    return value


def convert_azure(path: Path, progress: LineProgress | None = None) -> ParseResult:
    out = ParseResult()
    rows: list[tuple[int, float, int]] = []
    for no, row in enumerate(csv.reader(open_lines(path, newline="", progress=progress)), start=1):
        out.lines = no
        if no == 1 and row and row[0].strip().upper() == "TIMESTAMP":
            continue
        if not row:
            continue
        bad_bytes = undecodable(",".join(row))
        if bad_bytes is not None:
            out.errors.append(LineError(no, bad_bytes))
            continue
        try:
            if len(row) != 3:
                raise ValueError(f"expected 3 columns, got {len(row)}")
            ts = _azure_time(row[0])
            tokens = _tokens(_azure_int(row[1], "ContextTokens"), "ContextTokens")
            _azure_int(row[2], "GeneratedTokens")
        except ValueError as exc:
            out.errors.append(LineError(no, str(exc)))
            continue
        rows.append((no, ts, tokens))
    # Times count from the earliest request, not from the first row: a file that is not
    # sorted by time must not give negative times (which the AgentKV format rejects).
    t0 = min((ts for _, ts, _ in rows), default=0.0)
    next_block = 0
    for no, ts, tokens in rows:
        n = max(1, math.ceil(tokens / DEFAULT_BLOCK_TOKENS))
        blocks = tuple(range(next_block, next_block + n))
        next_block += n
        session = f"req-{no}"
        out.events.append(TraceEvent(session=session, ts=ts - t0, kind="model_call",
                                     tokens=tokens, prefix_blocks=blocks,
                                     state=StateType.TASK_INPUT))
        out.events.append(TraceEvent(session=session, ts=ts - t0, kind="task_end"))
    return out


def _iso(text: Any) -> float:
    if not isinstance(text, str):
        raise TypeError(f"timestamp must be a string, got {text!r}")
    return _utc_seconds(datetime.fromisoformat(text))


# Block ids a TraceLab session starts at: session k at k * SESSION_ID_SPAN, or after
# the previous session's last id when that session needed more (its ids never reach
# another session's).
SESSION_ID_SPAN = 1_000_000


class _TraceLabSession:
    def __init__(self, first_block: int) -> None:
        self.blocks: list[int] = []
        self.next = first_block

    def context(self, prefix_tokens: int, total_tokens: int) -> tuple[int, ...]:
        keep = min(prefix_tokens // DEFAULT_BLOCK_TOKENS, len(self.blocks))
        need = max(1, math.ceil(total_tokens / DEFAULT_BLOCK_TOKENS))
        fresh = list(range(self.next, self.next + max(0, need - keep)))
        self.next += len(fresh)
        self.blocks = self.blocks[:keep] + fresh
        return tuple(self.blocks)


def convert_tracelab(path: Path, progress: LineProgress | None = None) -> ParseResult:
    out = ParseResult()
    rows = []
    seen: dict[tuple[str, str | int], int] = {}  # (session, round id) -> its line
    for no, d in _json_lines(path, out, progress):
        try:
            session = _need(d, "session_id", str)
            if not session:  # a nameless session would merge every round without a name
                raise ValueError("session_id must be a non-empty string")
            key = _round_key(d, session)
            if key in seen:
                raise ValueError(f"round {key[1]!r} of session {session!r} repeats line "
                                 f"{seen[key]}")
            total = _need(d, "input_tokens_total", int)
            prefix = d.get("prefix_tokens") or 0
            if not isinstance(prefix, int) or prefix < 0 or total < 0:
                raise ValueError("token counts must be integers >= 0")
            _tokens(total, "input_tokens_total")
            if prefix > total:  # the cached prefix is part of the input
                raise ValueError(f"prefix_tokens {prefix} exceeds input_tokens_total {total}")
            events = [e for e in _need(d, "timing_events", list) if isinstance(e, dict)]
            if not events:
                raise ValueError("timing_events holds no event object")
            ts = min(_iso(e.get("timestamp")) for e in events)
            tools = [_tool(t) for t in _need(d, "tools", list)]
        except KeyError as exc:  # a tool without emitted_at / tool_wall_latency_ms
            out.errors.append(LineError(no, f"unusable round: a tool misses field {exc}"))
            continue
        except (ValueError, TypeError, OverflowError) as exc:
            out.errors.append(LineError(no, f"unusable round: {exc}"))
            continue
        rows.append((ts, session, total, prefix, tools))
        if key is not None:
            seen[key] = no
    if not rows:
        return out
    t0 = min(r[0] for r in rows)
    sessions: dict[str, _TraceLabSession] = {}
    s: _TraceLabSession | None = None
    for ts, session, total, prefix, tools in sorted(rows, key=lambda r: (r[1], r[0])):
        if session not in sessions:  # rows come session by session: s is the previous one
            first_id = len(sessions) * SESSION_ID_SPAN
            sessions[session] = _TraceLabSession(first_id if s is None
                                                 else max(first_id, s.next))
        s = sessions[session]
        first = not s.blocks
        out.events.append(TraceEvent(
            session=session, ts=ts - t0, kind="model_call", tokens=total,
            prefix_blocks=s.context(prefix, total),
            state=StateType.TASK_INPUT if first else StateType.TOOL_OBSERVATION))
        for name, emitted, latency in tools:
            out.events.append(TraceEvent(session=session, ts=max(emitted - t0, ts - t0),
                                         kind="tool_start", tool_class=name,
                                         tool_duration_s=latency))
    out.events = EventTable.from_events(sorted(out.events, key=lambda e: (e.ts, e.session)))
    return out


def _tool(t: Any) -> tuple[str, float, float]:
    """(name, emitted at, latency s) of one ``tools`` entry; an entry that is not an
    object, or has no usable latency, rejects its round (a tool dropped silently would
    shorten the session's gaps)."""
    if not isinstance(t, dict):
        raise TypeError(f"a tool is not a JSON object ({type(t).__name__})")
    return (str(t.get("tool_name") or "tool"), _iso(t["emitted_at"]),
            _latency_s(t["tool_wall_latency_ms"]))


def _round_key(d: dict, session: str) -> tuple[str, str | int] | None:
    """A round's identity in its session: ``round_id``, else ``round_index`` (None
    without either). A repeated one is the same round twice, not a new request."""
    for field in ("round_id", "round_index"):
        v = d.get(field)
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            return session, v
    return None


def _latency_s(value: Any) -> float:
    """A tool's wall latency in seconds: finite, >= 0 and at most MAX_SECONDS, like
    every other time (a larger one is a unit mistake, and would not reload)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or not 0 <= value / 1000.0 <= MAX_SECONDS:
        raise ValueError(f"tool_wall_latency_ms must be a finite number >= 0 and "
                         f"<= {MAX_SECONDS * 1000:g} ms, got {value!r}")
    return float(value) / 1000.0


CONVERTERS: dict[str, Callable[[Path, LineProgress | None], ParseResult]] = {
    "agentkv": read_trace,
    "mooncake": convert_mooncake,
    "azure": convert_azure,
    "tracelab": convert_tracelab,
}


def load_trace(path: Path, fmt: str, progress: LineProgress | None = None) -> ParseResult:
    """Read ``path`` in format ``fmt`` as AgentKV trace events; ``progress(n)`` is told
    of the source lines read as the reading goes."""
    try:
        converter = CONVERTERS[fmt]
    except KeyError:
        raise TraceFormatError(
            f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}") from None
    return converter(Path(path), progress)
