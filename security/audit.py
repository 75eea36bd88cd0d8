"""Append-only, hash-chained audit log with Ed25519-signed checkpoints.

One JSON object per line: ``seq``, ``time``, ``kind``, ``data``, ``prev`` (hash of
the previous record) and ``hash`` (SHA-256 of the other fields). Every
``checkpoint_every`` records a ``checkpoint`` record signs (count, head); after
every append the head file ``LOG.head`` holds a signed (count, head) so that
cutting records off the end is detected. ``verify_log`` checks all of it offline
with only the public key; anchors (positions from receipts or checkpoints kept
elsewhere) detect a rollback of log and head file together.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from security.errors import AuditLogError
from security.principals import Principal
from security.signing import (
    NonFiniteNumber,
    Signer,
    Verifier,
    atomic_write,
    canonical_json,
    fingerprint,
    loads_finite,
)

GENESIS = "0" * 64
CHECKPOINT = "checkpoint"
_KIND_RE = re.compile(r"[a-z][a-z0-9_.]{0,47}")
_MAX_DATA = 65536
_CHECKPOINT_DOMAIN = b"agentkv-audit-checkpoint/v1\0"


@dataclass(frozen=True, kw_only=True)
class AuditPosition:
    """Where a record sits: its sequence number and its hash."""

    seq: int
    hash: str


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    ok: bool
    records: int
    checkpoints: int
    head: str
    problems: tuple[str, ...]


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def _record_hash(seq: int, time: float, kind: str, data: object, prev: str) -> str:
    body = canonical_json({"seq": seq, "time": time, "kind": kind, "data": data, "prev": prev})
    return hashlib.sha256(body).hexdigest()


def _checkpoint_message(count: int, head: str) -> bytes:
    return _CHECKPOINT_DOMAIN + canonical_json({"count": count, "head": head})


class AuditLog:
    """Appends records; refuses to extend a log whose chain is broken.

    Safe across threads and processes: each append holds an exclusive ``flock`` on the
    log, and a writer that finds the file grown by another one re-reads (and re-verifies)
    the chain before extending it, so two writers never fork it.
    """

    def __init__(self, path: str | os.PathLike[str], signer: Signer, *,
                 checkpoint_every: int = 64, fsync: bool = True) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        self.path = Path(path)
        self.signer = signer
        self.checkpoint_every = checkpoint_every
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._end = -1  # file size after our last write; -1: chain state not read yet
        self._own_time = float("-inf")
        try:
            with self._exclusive():  # read under the lock: no writer is halfway through a line
                self._check_signer()
        except BaseException:
            os.close(self._fd)
            raise
        self._own_time = self._time  # this writer's clock may not go back past the chain

    def _check_signer(self) -> None:
        """Refuse to extend a log that another key signs: ``verify_log`` takes one public
        key, so from the first record signed with a second key on, the log would verify
        under neither (one wrong ``--signing-key`` broke the evidence chain for good)."""
        mine = fingerprint(self.signer.public_raw())
        if self._seq and (self._key not in (None, mine) or not _head_signed_by(
                self.path, Verifier(self.signer.public_raw()))):
            raise AuditLogError(f"{self.path} is signed with another key (checkpoint key "
                                f"{self._key or 'unknown'}, this writer's is {mine}): refusing "
                                "to append; use the log's signing key, or start a new log")

    def _recover(self, limit: int | None = None) -> tuple[int, str, float, int]:
        """The chain state of the log's first ``limit`` bytes (all of it: None)."""
        seq, prev, last_time, since = 0, GENESIS, float("-inf"), 0
        self._key: str | None = None  # the key id of the last checkpoint
        if not self.path.exists():
            return seq, prev, last_time, since
        for lineno, rec in _read_records(self.path, limit):
            if isinstance(rec, str):
                raise AuditLogError(f"{self.path}: chain broken at {rec}; refusing to append")
            if rec.get("seq") != seq or rec.get("prev") != prev or \
                    rec.get("hash") != _record_hash(seq, rec["time"], rec["kind"], rec["data"], prev):
                raise AuditLogError(f"{self.path}: chain broken at line {lineno}; refusing to append")
            seq, prev, last_time = seq + 1, rec["hash"], rec["time"]
            since = 0 if rec["kind"] == CHECKPOINT else since + 1
            if rec["kind"] == CHECKPOINT and isinstance(rec["data"], dict):
                self._key = rec["data"].get("key")
        return seq, prev, last_time, since

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the log against other writers (threads here, other processes) and bring
        the chain state up to date with what they appended."""
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(self._fd).st_size
                if size != self._end:
                    torn = _torn_tail(self.path, size)
                    self._seq, self._prev, self._time, self._since = self._recover(size - torn)
                    if torn:
                        self._drop_torn_tail(size - torn, torn)
                yield
                self._end = os.fstat(self._fd).st_size
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _drop_torn_tail(self, keep: int, torn: int) -> None:
        """The log ends in ``torn`` bytes without a newline. The head file is written after
        each record, so if it vouches for the chain before them, a crash cut a write short:
        cut them off, with a ``repair`` record saying so; else they were edited: refuse."""
        try:
            count, top, sig = _read_head(self.path)
        except (OSError, ValueError, KeyError, TypeError):
            count, top, sig = -1, "", b""
        if (count, top) != (self._seq, self._prev) or not Verifier(
                self.signer.public_raw()).verify(sig, _checkpoint_message(count, top)):
            raise AuditLogError(f"{self.path}: chain broken at line {self._seq + 1}: last line "
                                "is incomplete and the signed head does not end the chain "
                                "before it (edited); refusing to append")
        os.ftruncate(self._fd, keep)
        self._write("repair", {"dropped_bytes": torn, "reason": "a write cut short"},
                    max(self._time, 0.0))  # the chain's own time: callers choose the clock
        self._since += 1
        self._write_head()

    @property
    def head(self) -> AuditPosition:
        return AuditPosition(seq=self._seq - 1, hash=self._prev)

    def append(self, kind: str, data: Mapping[str, object], now: float) -> AuditPosition:
        """Append one record; returns its position."""
        if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind) or kind == CHECKPOINT:
            raise ValueError(f"invalid audit record kind: {kind!r:.60}")
        encoded = canonical_json(dict(data))
        if len(encoded) > _MAX_DATA:
            raise ValueError("audit record data is larger than 64 KiB")
        # Hashed as a verifier will read it back: JSON makes int keys strings (which then
        # sort differently) and tuples lists, so a hash of ``data`` as given would not match.
        payload = loads_finite(encoded)
        with self._exclusive():
            pos = self._write(kind, payload, now)
            self._since += 1
            if self._since >= self.checkpoint_every:
                self._write_checkpoint(now)
            self._write_head()
            return pos

    def checkpoint(self, now: float) -> AuditPosition:
        """Sign the current head into the log now (also done on ``close``)."""
        with self._exclusive():
            pos = self._write_checkpoint(now)
            self._write_head()
            return pos

    def close(self, now: float | None = None) -> None:
        if self._fd < 0:
            return
        if now is not None and self._since:
            self.checkpoint(now)
        os.close(self._fd)
        self._fd = -1

    def _write(self, kind: str, data: dict, now: float) -> AuditPosition:
        if self._fd < 0:
            raise AuditLogError("audit log is closed")
        now = float(now)
        if now < self._own_time:
            raise ValueError("audit time went backwards")
        # Another writer may have appended a later time while this one waited for the lock:
        # the record takes that time, so the chain's times never decrease.
        now = max(now, self._time)
        self._own_time = now
        record_hash = _record_hash(self._seq, now, kind, data, self._prev)
        line = canonical_json({"seq": self._seq, "time": now, "kind": kind, "data": data,
                               "prev": self._prev, "hash": record_hash}) + b"\n"
        os.write(self._fd, line)
        if self.fsync:
            os.fsync(self._fd)
        pos = AuditPosition(seq=self._seq, hash=record_hash)
        self._seq, self._prev, self._time = self._seq + 1, record_hash, now
        return pos

    def _write_checkpoint(self, now: float) -> AuditPosition:
        sig = self.signer.sign(_checkpoint_message(self._seq, self._prev))
        data = {"count": self._seq, "head": self._prev, "sig": sig.hex(),
                "key": fingerprint(self.signer.public_raw())}
        self._since = 0
        return self._write(CHECKPOINT, data, max(float(now), self._time))

    def _write_head(self) -> None:
        sig = self.signer.sign(_checkpoint_message(self._seq, self._prev))
        atomic_write(head_path(self.path), canonical_json(
            {"count": self._seq, "head": self._prev, "sig": sig.hex()}) + b"\n", fsync=self.fsync)


def _torn_tail(path: Path, size: int) -> int:
    """How many bytes of the log's first ``size`` follow its last newline (0: none)."""
    with open(path, "rb") as fh:
        end = size
        while end > 0:
            start = max(0, end - 65536)
            fh.seek(start)
            cut = fh.read(end - start).rfind(b"\n")
            if cut >= 0:
                return size - (start + cut + 1)
            end = start
    return size


def _read_head(path: Path) -> tuple[int, str, bytes]:
    """The head file's (count, head hash, signature); raises what reading it raised."""
    head = loads_finite(head_path(path).read_bytes())
    return int(head["count"]), str(head["head"]), bytes.fromhex(head["sig"])


def _read_records(path: Path, limit: int | None = None) -> Iterable[tuple[int, dict | str]]:
    """(line number, record) or (line number, problem text) for each line (up to ``limit``
    bytes). A line must be byte for byte the canonical JSON the writer wrote, newline included:
    the hash covers the parsed record, so spacing, key order, a duplicate key (the parser
    keeps the last one; a reader of the text may see the first) or a line ending
    changed would otherwise leave an edited line that still verifies, and a last line
    without its newline would merge with the next record appended.
    """
    with open(path, "rb") as fh:  # ``limit`` falls on a line's end: stop after that line
        for lineno, raw in enumerate(fh, 1):
            if limit is not None and (limit := limit - len(raw)) < 0:
                return
            yield lineno, _parse_line(lineno, raw)


def _parse_line(lineno: int, raw: bytes) -> dict | str:
    """The record on one line (``raw`` with its newline), or the problem with it."""
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


def _head_signed_by(path: Path, verifier: Verifier) -> bool:
    """Whether the head file's signature verifies under ``verifier`` (a missing or
    malformed head file is ``verify_log``'s finding, not a sign of another key)."""
    try:
        count, top, sig = _read_head(path)
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return verifier.verify(sig, _checkpoint_message(count, top))


def _check_checkpoint(rec: dict, seq: int, prev: str, verifier: Verifier) -> str | None:
    data = rec["data"]
    if not isinstance(data, dict) or data.get("count") != seq or data.get("head") != prev:
        return f"seq {seq}: checkpoint does not match the chain before it"
    try:
        sig = bytes.fromhex(data.get("sig", ""))
    except (TypeError, ValueError):
        sig = b""
    if not verifier.verify(sig, _checkpoint_message(seq, prev)):
        mine, theirs = fingerprint(verifier.raw), data.get("key")
        if isinstance(theirs, str) and re.fullmatch(r"[0-9a-f]{16}", theirs) and theirs != mine:
            return (f"seq {seq}: checkpoint signature does not verify: it names key {theirs}, "
                    f"the public key given is {mine} (wrong --public-key, or forged)")
        return f"seq {seq}: checkpoint signature does not verify"
    return None


def _check_head(path: Path, hashes: list[str], verifier: Verifier) -> list[str]:
    hp = head_path(path)
    try:
        count, head_hash, sig = _read_head(path)
    except FileNotFoundError:
        return [f"head file {hp} is missing (cannot rule out truncation)"]
    except OSError as exc:
        return [f"head file {hp} cannot be read ({exc.strerror})"]
    except (ValueError, KeyError, TypeError):
        return [f"head file {hp} is malformed"]
    if not verifier.verify(sig, _checkpoint_message(count, head_hash)):
        return ["head file signature does not verify"]
    if count > len(hashes):
        return [f"truncated: signed head has {count} records, log has {len(hashes)}"]
    if count < len(hashes):
        return [f"{len(hashes) - count} records after the signed head are not covered by a signature"]
    if count and hashes[-1] != head_hash or not count and head_hash != GENESIS:
        return ["log end does not match the signed head (rewritten)"]
    return []


def verify_log(path: str | os.PathLike[str], public_key: Verifier, *,
               anchors: Iterable[AuditPosition] = ()) -> VerifyReport:
    """Check hashes, links, order, time, signatures, the signed head and the anchors."""
    path = Path(path)
    problems: list[str] = []
    hashes: list[str] = []
    prev, last_time, checkpoints = GENESIS, float("-inf"), 0
    if not path.exists():
        return VerifyReport(ok=False, records=0, checkpoints=0, head=GENESIS,
                            problems=(f"{path} does not exist",))
    for lineno, rec in _read_records(path):
        seq = len(hashes)
        if isinstance(rec, str):
            problems.append(rec)
            break
        if rec["seq"] != seq:
            problems.append(f"line {lineno}: seq {rec['seq']} where {seq} was expected "
                            "(record deleted, inserted or reordered)")
        if rec["prev"] != prev:
            problems.append(f"line {lineno}: link to the previous record is broken")
        if rec["hash"] != _record_hash(rec["seq"], rec["time"], rec["kind"], rec["data"], rec["prev"]):
            problems.append(f"line {lineno}: record hash does not match its contents (edited)")
        if rec["time"] < last_time:
            problems.append(f"line {lineno}: time goes backwards")
        if rec["kind"] == CHECKPOINT:
            checkpoints += 1
            bad = _check_checkpoint(rec, seq, prev, public_key)
            if bad:
                problems.append(bad)
        if problems:
            break  # after the first break the rest of the chain proves nothing
        hashes.append(rec["hash"])
        prev, last_time = rec["hash"], rec["time"]
    if not problems:
        problems.extend(_check_head(path, hashes, public_key))
    for anchor in anchors:
        if anchor.seq < 0:
            problems.append(f"anchor seq {anchor.seq} is negative: no record has it")
        elif anchor.seq >= len(hashes):
            problems.append(f"rollback: anchored record seq {anchor.seq} is not in the log")
        elif hashes[anchor.seq] != anchor.hash:
            problems.append(f"anchored record seq {anchor.seq} is another record in this log "
                            "(the log was rewritten, or the anchor comes from another log)")
    return VerifyReport(ok=not problems, records=len(hashes), checkpoints=checkpoints,
                        head=prev, problems=tuple(problems))


def denial_recorder(log: AuditLog, clock: Callable[[], float]
                    ) -> Callable[[Principal, str, str, str], None]:
    """An ``AccessPolicy`` hook that appends every cross-tenant denial to ``log``."""

    def record(principal: Principal, namespace: str, action: str, reason: str = "") -> None:
        log.append("access.denied", {"tenant": principal.tenant, "subject": principal.subject,
                                     "namespace": namespace[:80], "action": action,
                                     "reason": reason[:120]}, clock())

    return record
