"""The audit log's form on disk, which its writer and its verifier both read.

The log is one canonical JSON record per line, newline included::

    {"data":{...},"hash":H(n),"kind":"erasure","prev":H(n-1),"seq":n,"time":T}\\n

``hash`` is SHA-256 over the canonical JSON of the other five fields; ``prev`` of
record 0 is ``GENESIS``. The head file ``LOG.head`` holds one signed (count, head).
Lines are read with a bound (``MAX_LINE_BYTES``): a line longer than that is an
``AuditRecordTooLarge``, found after reading at most that many bytes of it (plus one
read buffer), so a corrupt or hostile multi-GB line is never held in memory.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from security.errors import AuditRecordTooLarge
from security.signing import NonFiniteNumber, Verifier, canonical_json, loads_finite

GENESIS = "0" * 64
CHECKPOINT = "checkpoint"
MAX_DATA_BYTES = 65536  # a record's ``data``, as canonical JSON; the writer refuses more
# A record line is its data plus at most a few hundred bytes (seq, time, kind, two
# hashes, the keys): about 66 KiB. The bound is well above that and still small to hold.
MAX_LINE_BYTES = 1 << 20
MAX_HEAD_BYTES = 4096  # the head file is about 200 bytes
_CHECKPOINT_DOMAIN = b"agentkv-audit-checkpoint/v1\0"


@dataclass(frozen=True, kw_only=True)
class AuditPosition:
    """Where a record sits: its sequence number and its hash."""

    seq: int
    hash: str


class Line(NamedTuple):
    """One line of the log: its number (from 1), the byte offset it starts at, its bytes."""

    lineno: int
    offset: int
    raw: bytes


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def record_hash(seq: int, time: float, kind: str, data: object, prev: str) -> str:
    body = canonical_json({"seq": seq, "time": time, "kind": kind, "data": data, "prev": prev})
    return hashlib.sha256(body).hexdigest()


def checkpoint_message(count: int, head: str) -> bytes:
    return _CHECKPOINT_DOMAIN + canonical_json({"count": count, "head": head})


def pending_head_path(path: Path) -> Path:
    """Where a writer signs the head over the records it is about to append, before it
    appends them; renamed over the head file once they are durable (``AuditLog._commit``)."""
    return path.with_name(path.name + ".head.next")


def read_head(path: Path, *, pending: bool = False) -> tuple[int, str, bytes]:
    """The head file's (count, head hash, signature) (``pending``: the pending head's);
    raises what reading it raised, and ValueError for a head file longer than
    ``MAX_HEAD_BYTES`` (not read past that)."""
    with open(pending_head_path(path) if pending else head_path(path), "rb") as fh:
        data = fh.read(MAX_HEAD_BYTES + 1)
    if len(data) > MAX_HEAD_BYTES:
        raise ValueError("head file is too large")
    head = loads_finite(data)
    return int(head["count"]), str(head["head"]), bytes.fromhex(head["sig"])


def readable_head(path: Path, *, pending: bool = False) -> tuple[int, str, bytes] | None:
    """``read_head``, or None where the head file is missing or malformed (that is
    ``verify_log``'s finding, not a sign of another key or of a cut log)."""
    try:
        return read_head(path, pending=pending)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def vouches(head: tuple[int, str, bytes] | None, count: int, top: str,
            verifier: Verifier) -> bool:
    """``head`` is signed with ``verifier``'s key over exactly this chain end."""
    return head is not None and head[:2] == (count, top) and verifier.verify(
        head[2], checkpoint_message(count, top))


def iter_lines(fh: BinaryIO, *, offset: int = 0, lineno: int = 1,
               end: int | None = None) -> Iterator[Line]:
    """The lines of ``fh`` from ``offset`` (where line ``lineno`` starts) to ``end`` (the end
    of the file: None), each with its newline; only the last may lack one. Raises
    ``AuditRecordTooLarge`` at a line longer than ``MAX_LINE_BYTES``, of which it read at
    most that many bytes (plus what ``fh`` buffers ahead: one buffer)."""
    fh.seek(offset)
    while end is None or offset < end:
        cap = MAX_LINE_BYTES if end is None else min(MAX_LINE_BYTES, end - offset)
        raw = fh.readline(cap)
        if not raw:
            return
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise AuditRecordTooLarge(lineno, offset, MAX_LINE_BYTES)
        yield Line(lineno, offset, raw)
        offset, lineno = offset + len(raw), lineno + 1


def read_records(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line number, record) or (line number, problem text) for each line of the log; a
    line longer than ``MAX_LINE_BYTES`` is the last problem, and nothing after it is read."""
    with open(path, "rb") as fh:
        try:
            for line in iter_lines(fh):
                yield line.lineno, parse_line(line.lineno, line.raw)
        except AuditRecordTooLarge as exc:
            yield exc.lineno, str(exc)


def parse_line(lineno: int, raw: bytes) -> dict | str:
    """The record on one line (``raw`` with its newline), or the problem with it.

    A line must be byte for byte the canonical JSON the writer wrote, newline included:
    the hash covers the parsed record, so spacing, key order, a duplicate key (the parser
    keeps the last one; a reader of the text may see the first) or a line ending changed
    would otherwise leave an edited line that still verifies, and a last line without its
    newline would merge with the next record appended.
    """
    if not raw.endswith(b"\n"):
        return f"line {lineno}: last line is incomplete, no newline (a write cut short, or edited)"
    try:
        rec = loads_finite(raw)
    except NonFiniteNumber as exc:  # no hash covers it: canonical JSON cannot hold it
        return f"line {lineno}: record holds a {exc} (edited)"
    except ValueError:
        return f"line {lineno}: not a JSON record (edited or cut)"
    if not isinstance(rec, dict) or set(rec) != {"seq", "time", "kind", "data", "prev", "hash"} \
            or not isinstance(rec["time"], (int, float)) or not isinstance(rec["kind"], str):
        return f"line {lineno}: record has the wrong shape"
    try:
        canonical = canonical_json(rec) + b"\n" == raw
    except (ValueError, RecursionError):
        canonical = False
    if not canonical:
        return (f"line {lineno}: record is not in the form the writer writes (edited: spacing, "
                "key order, a duplicate key or the line ending changed)")
    return rec


def links(rec: dict, seq: int, prev: str) -> bool:
    """Whether ``rec`` is record ``seq`` of a chain whose last hash is ``prev``."""
    return rec["seq"] == seq and rec["prev"] == prev and \
        rec["hash"] == record_hash(seq, rec["time"], rec["kind"], rec["data"], prev)


def same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not moved, replaced, deleted)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
