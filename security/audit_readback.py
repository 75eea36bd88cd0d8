"""One record of an audit log read back by its position, from the end of the file.

``AuditLog.append`` returns only (seq, hash), while the time it wrote may be later than
the one it was given (another writer's record stamped later came first: the chain's times
never decrease). What the record holds is what a verifier, and ``Eraser.reissue``, see.
"""

from __future__ import annotations

import os
from pathlib import Path

from security.audit_format import MAX_LINE_BYTES, AuditPosition, parse_line

_FIRST_WINDOW = 1 << 16  # a record just appended is one of the last few lines


def record_at(path: str | os.PathLike[str], pos: AuditPosition) -> dict | None:
    """The record at ``pos`` (its seq and hash both match), or None when the log does not
    hold it. Read backwards in growing windows: a record just appended costs one read."""
    with open(Path(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        window = _FIRST_WINDOW
        while True:
            start = max(0, size - window)
            fh.seek(start)
            lines = fh.read(size - start).split(b"\n")
            if start:
                lines = lines[1:]  # the first may be the tail of a line before the window
            for raw in reversed(lines):
                rec = parse_line(0, raw + b"\n") if raw else None
                if not isinstance(rec, dict) or not isinstance(rec["seq"], int):
                    continue
                if rec["seq"] == pos.seq:
                    return rec if rec["hash"] == pos.hash else None
                if rec["seq"] < pos.seq:  # read past where it would be
                    return None
            if start == 0:
                return None
            window = min(window * 4, size + MAX_LINE_BYTES)


def written_time(path: str | os.PathLike[str], pos: AuditPosition, given: float) -> float:
    """The time the record at ``pos`` holds; ``given`` (the time the caller gave) when it
    cannot be read back, which only a log moved or cut since the append would cause."""
    try:
        rec = record_at(path, pos)
    except OSError:
        return given
    return float(rec["time"]) if rec is not None else given
