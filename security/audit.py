"""Append-only, hash-chained audit log with Ed25519-signed checkpoints.

One JSON object per line (the form is in ``audit_format``): ``seq``, ``time``, ``kind``,
``data``, ``prev`` (hash of the previous record) and ``hash`` (SHA-256 of the other
fields). Every ``checkpoint_every`` records a ``checkpoint`` record signs (count, head);
after every append the head file ``LOG.head`` holds a signed (count, head) so that
cutting records off the end is detected. ``verify_log`` checks all of it offline
with only the public key; anchors (positions from receipts or checkpoints kept
elsewhere) detect a rollback of log and head file together.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from security.audit_format import (
    CHECKPOINT,
    GENESIS,
    MAX_DATA_BYTES,
    AuditPosition,
    Line,
    checkpoint_message,
    head_path,
    iter_lines,
    links,
    parse_line,
    pending_head_path,
    read_head,
    readable_head,
    record_hash,
    same_file,
    vouches,
)
from security.audit_verify import VerifyReport, verify_log
from security.errors import AuditLogError, AuditRecordTooLarge
from security.key_sources import fsync_dir, write_all
from security.principals import Principal
from security.signing import (
    Signer,
    Verifier,
    atomic_write,
    canonical_json,
    fingerprint,
    loads_finite,
)

__all__ = ["CHECKPOINT", "GENESIS", "AuditLog", "AuditPosition", "AuditRecordTooLarge",
           "VerifyReport", "denial_recorder", "head_path", "verify_log"]

_KIND_RE = re.compile(r"[a-z][a-z0-9_.]{0,47}")


class AuditLog:
    """Appends records; refuses to extend a log whose chain is broken.

    Safe across threads and processes: each append holds an exclusive ``flock`` on the
    log, and a writer that finds the file grown by another one verifies the records
    appended since it last looked before extending the chain, so two writers never fork
    it. It verifies only those: it keeps the byte offset where the last record it verified
    (or wrote) ends, and that record's line, and refuses the log when the file no longer
    holds that line there (truncated or rewritten) or the path names another file.
    """

    def __init__(self, path: str | os.PathLike[str], signer: Signer, *,
                 checkpoint_every: int = 64, fsync: bool = True) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        self.path = Path(path)
        self.signer = signer
        self._verifier = Verifier(signer.public_raw())  # checks heads signed with its key
        self.checkpoint_every = checkpoint_every
        self.fsync = fsync
        self._lock = threading.Lock()
        # Read as well as written through this descriptor: what it verifies is what it extends.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        # The chain as far as this writer verified or wrote it: the next seq, the last
        # hash, time and checkpoint key, records since the last checkpoint, and where the
        # last record's line (``_last``) ends in the file.
        self._seq, self._prev, self._time, self._since = 0, GENESIS, float("-inf"), 0
        self._key: str | None = None
        self._offset, self._last = 0, b""
        self._unwritten: list[bytes] = []  # records of this call, written by ``_commit``
        self._mark: tuple | None = None  # set by ``_catch_up``
        # The time each thread last wrote: a thread's clock may not go back, while a time
        # taken before another thread's (or writer's) append is not a clock going back.
        self._own, self._opened_at = threading.local(), float("-inf")
        self._ready = False  # opened: its own checks done
        try:
            with self._exclusive():  # read under the lock: no writer is halfway through a line
                self._check_signer()
                self._check_covered()
                if self._seq == 0 and readable_head(self.path) is None:
                    self._sign_head()  # an empty log is vouched for too: verify passes it
        except BaseException:
            os.close(self._fd)
            raise
        self._opened_at = self._time  # no thread's clock may go back past the chain's
        self._ready = True

    @property
    def _own_time(self) -> float:
        return getattr(self._own, "time", self._opened_at)

    @_own_time.setter
    def _own_time(self, value: float) -> None:
        self._own.time = value

    def _check_signer(self) -> None:
        """Refuse to extend a log that another key signs: ``verify_log`` takes one public
        key, so from the first record signed with a second key on, the log would verify
        under neither (one wrong ``--signing-key`` broke the evidence chain for good). Nor
        one shorter than its signed head: the next head would sign the cut chain anew."""
        mine = fingerprint(self.signer.public_raw())
        head = readable_head(self.path)  # read once for both checks
        signed = head is not None and self._verifier.verify(head[2],
                                                            checkpoint_message(*head[:2]))
        if self._seq and (self._key not in (None, mine) or head is not None and not signed):
            raise AuditLogError(f"{self.path} is signed with another key (checkpoint key "
                                f"{self._key or 'unknown'}, this writer's is {mine}): refusing "
                                "to append; use the log's signing key, or start a new log")
        if head is not None and head[0] > self._seq and not signed:  # (an empty log)
            raise AuditLogError(f"{self.path} holds no record, and a head file that this "
                                f"writer's key ({mine}) did not sign claims {head[0]}: refusing "
                                "to append (keep both as evidence and start a new log)")
        if head is not None and head[0] > self._seq:
            raise AuditLogError(f"{self.path} holds {self._seq} records, its signed head "
                                f"{head[0]}: it was truncated; refusing to append (keep it "
                                "as evidence and start a new log)")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the log against other writers (threads here, other processes) and bring
        the chain state up to date with what they appended."""
        if self._fd < 0:
            raise AuditLogError("audit log is closed")
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                if not same_file(self.path, self._fd):
                    raise AuditLogError(f"{self.path} is no longer the file this writer opened "
                                        "(moved, replaced or deleted): refusing to append to a "
                                        "file no verifier reads; open the log again")
                size = os.fstat(self._fd).st_size
                if size != self._offset:
                    self._catch_up(size)
                    if self._ready:  # (at open: after the key check)
                        self._check_covered()
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """An append that fails (a disk that fills, an fsync error) leaves the log as it
        was: what it wrote is cut off, the chain state rolled back, the head file kept or
        put back, so a record is either in the log and vouched for or not there at all
        (a caller that saw the error may rely on it). Run under ``_exclusive``."""
        chain, own_time = self._chain(), self._own_time
        try:
            yield
        except BaseException:
            self._set_chain(chain)
            self._own_time = own_time
            self._unwritten = []
            os.ftruncate(self._fd, self._offset)
            with contextlib.suppress(OSError):
                os.unlink(pending_head_path(self.path))
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                if read_head(self.path)[:2] != (self._seq, self._prev):  # replaced already
                    self._sign_head()
            raise

    def _catch_up(self, size: int) -> None:
        """Verify the records other writers appended since this one last looked (the
        file's first ``size`` bytes), from where it stopped: never the part it verified."""
        if size < self._offset or os.pread(self._fd, len(self._last),
                                           self._offset - len(self._last)) != self._last:
            raise AuditLogError(f"{self.path}: record {self._seq - 1} is no longer where this "
                                "writer verified it (the log was truncated or rewritten); "
                                "refusing to append")
        torn: Line | None = None
        head = readable_head(self.path)
        self._mark = None  # the chain where the signed head ends it, if this read passes it
        with open(self._fd, "rb", closefd=False) as fh:
            try:
                self._mark_if_head(head)
                for line in iter_lines(fh, offset=self._offset, lineno=self._seq + 1, end=size):
                    if not line.raw.endswith(b"\n"):
                        torn = line  # only the last line can lack its newline
                        break
                    self._advance(line)
                    self._mark_if_head(head)
            except AuditRecordTooLarge as exc:
                raise AuditRecordTooLarge(exc.lineno, exc.offset, exc.limit, self.path) from None
        if torn is not None:
            self._drop_torn_tail(torn.offset, len(torn.raw), head)

    def _mark_if_head(self, head: tuple[int, str, bytes] | None) -> None:
        if self._mark is None and vouches(head, self._seq, self._prev, self._verifier):
            self._mark = self._chain()

    def _chain(self) -> tuple:
        """The chain state (``_set_chain`` puts it back)."""
        return (self._seq, self._prev, self._time, self._since, self._key, self._offset,
                self._last)

    def _set_chain(self, chain: tuple) -> None:
        (self._seq, self._prev, self._time, self._since, self._key, self._offset,
         self._last) = chain

    def _cut_short(self) -> bool:
        """A writer's call cut off part way (a kill, a short write at a page boundary):
        the signed head ends the chain at an earlier record (``_mark``) and its pending head,
        signed before it wrote, vouches for more records than the file holds whole. What
        follows the head is that call's unfinished prefix, never acknowledged to its caller:
        cut back to the head, with a ``repair`` record (records no writer signed for are
        dropped, never signed over). False where that is not the case."""
        pending = readable_head(self.path, pending=True)
        if self._mark is None or pending is None or pending[0] <= self._seq or not \
                vouches(pending, *pending[:2], self._verifier):
            return False
        size = os.fstat(self._fd).st_size
        dropped = self._seq - self._mark[0]
        self._set_chain(self._mark)
        os.ftruncate(self._fd, self._offset)
        self._write("repair", {"dropped_bytes": size - self._offset, "dropped_records": dropped,
                               "reason": "a write cut short"}, max(self._time, 0.0))
        self._since += 1
        self._commit()
        return True

    def _advance(self, line: Line) -> None:
        """Take one more verified record into the chain state, or refuse the log."""
        rec = parse_line(line.lineno, line.raw)
        if isinstance(rec, str):
            raise AuditLogError(f"{self.path}: chain broken at {rec}; refusing to append")
        if not links(rec, self._seq, self._prev):
            raise AuditLogError(f"{self.path}: chain broken at line {line.lineno}; refusing to append")
        self._seq, self._prev, self._time = self._seq + 1, rec["hash"], rec["time"]
        self._since = 0 if rec["kind"] == CHECKPOINT else self._since + 1
        if rec["kind"] == CHECKPOINT and isinstance(rec["data"], dict):
            self._key = rec["data"].get("key")
        self._offset, self._last = line.offset + len(line.raw), line.raw

    def _drop_torn_tail(self, keep: int, torn: int, head: tuple[int, str, bytes] | None
                        ) -> None:
        """The log ends in ``torn`` bytes without a newline. The head file is written after
        each record, so if it vouches for the chain before them, a crash cut a write short:
        cut them off, with a ``repair`` record saying so; else they were edited: refuse."""
        if not vouches(head, self._seq, self._prev, self._verifier):
            if self._cut_short():
                return
            raise AuditLogError(f"{self.path}: chain broken at line {self._seq + 1}: last line "
                                "is incomplete and the signed head does not end the chain "
                                "before it (edited); refusing to append")
        os.ftruncate(self._fd, keep)
        self._write("repair", {"dropped_bytes": torn, "reason": "a write cut short"},
                    max(self._time, 0.0))  # the chain's own time: callers choose the clock
        self._since += 1
        self._commit()

    @property
    def head(self) -> AuditPosition:
        return AuditPosition(seq=self._seq - 1, hash=self._prev)

    def append(self, kind: str, data: Mapping[str, object], now: float) -> AuditPosition:
        """Append one record; returns its position."""
        if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind) or kind == CHECKPOINT:
            raise ValueError(f"invalid audit record kind: {kind!r:.60}")
        encoded = canonical_json(dict(data))
        if len(encoded) > MAX_DATA_BYTES:
            raise ValueError("audit record data is larger than 64 KiB")
        # Hashed as a verifier will read it back: JSON makes int keys strings (which then
        # sort differently) and tuples lists, so a hash of ``data`` as given would not match.
        payload = loads_finite(encoded)
        with self._exclusive(), self._all_or_nothing():
            pos = self._write(kind, payload, now)
            self._since += 1
            if self._since >= self.checkpoint_every:
                self._write_checkpoint(now)
            self._commit()
            return pos

    def checkpoint(self, now: float) -> AuditPosition:
        """Sign the current head into the log now (also done on ``close``)."""
        with self._exclusive(), self._all_or_nothing():
            pos = self._write_checkpoint(now)
            self._commit()
            return pos

    def close(self, now: float | None = None) -> None:
        if self._fd < 0:
            return
        if now is not None and self._since:
            self.checkpoint(now)
        os.close(self._fd)
        self._fd = -1

    def _write(self, kind: str, data: dict, now: float) -> AuditPosition:
        """Write one record (not yet durable: ``_commit`` makes it so)."""
        now = float(now)
        if now < self._own_time:
            raise ValueError("audit time went backwards")
        # This thread's clock, as the caller gave it: a time it reuses after its record was
        # moved up to another's is not a clock going back.
        self._own_time = now
        # Another writer (or thread) may have appended a later time since this time was
        # taken: the record takes that time, so the chain's times never decrease.
        now = max(now, self._time)
        rec_hash = record_hash(self._seq, now, kind, data, self._prev)
        line = canonical_json({"seq": self._seq, "time": now, "kind": kind, "data": data,
                               "prev": self._prev, "hash": rec_hash}) + b"\n"
        self._unwritten.append(line)
        pos = AuditPosition(seq=self._seq, hash=rec_hash)
        self._seq, self._prev, self._time = self._seq + 1, rec_hash, now
        self._offset, self._last = self._offset + len(line), line
        return pos

    def _write_checkpoint(self, now: float) -> AuditPosition:
        sig = self.signer.sign(checkpoint_message(self._seq, self._prev))
        data = {"count": self._seq, "head": self._prev, "sig": sig.hex(),
                "key": fingerprint(self.signer.public_raw())}
        self._since = 0  # ``_write`` moves it up to the chain's time, not this thread's clock
        return self._write(CHECKPOINT, data, max(float(now), self._own_time))

    def _commit(self) -> None:
        """Append the records of this call so that no moment leaves one that no signature
        covers: the head over the new chain end is signed into ``LOG.head.next`` first,
        then the records are written and made durable (one fsync for all), then that file
        is renamed over the head. A writer cut off before the rename left records only
        ``LOG.head.next`` vouches for: the next writer checks them and finishes the rename
        (``_check_covered``). So records after the signed head that nothing vouches for
        were not appended by a writer: they are refused, never signed over."""
        lines, self._unwritten = b"".join(self._unwritten), []
        pending = pending_head_path(self.path)
        fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, self._head_bytes())
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        write_all(self._fd, lines)
        if self.fsync:
            os.fsync(self._fd)
        self._promote(pending)

    def _promote(self, pending: Path) -> None:
        os.replace(pending, head_path(self.path))
        if self.fsync:
            fsync_dir(self.path.parent)

    def _check_covered(self) -> None:
        """Refuse a chain whose end no signature vouches for: records after the signed head
        that neither the head nor ``LOG.head.next`` covers were appended without the key
        (a forged ``erasure`` record, say), and signing a head over them would vouch for
        them. Run under ``_exclusive`` after reading other writers' records."""
        if not self._seq:
            return
        head = readable_head(self.path)
        if vouches(head, self._seq, self._prev, self._verifier):
            return
        if vouches(readable_head(self.path, pending=True), self._seq, self._prev,
                   self._verifier):
            self._promote(pending_head_path(self.path))  # a writer cut off before its rename
            return
        if self._cut_short():  # ... or part way through writing its records
            return
        signed = head is not None and self._verifier.verify(head[2],
                                                            checkpoint_message(*head[:2]))
        covered = f"its signed head covers {head[0]}" if signed and head else "no signed head"
        raise AuditLogError(f"{self.path} holds {self._seq} records and {covered}: the records "
                            "after it were not appended by a writer with this log's key; "
                            "refusing to sign over them (`agentkv audit verify` names them; "
                            "keep the log as evidence and start a new log)")

    def _head_bytes(self) -> bytes:
        sig = self.signer.sign(checkpoint_message(self._seq, self._prev))
        return canonical_json({"count": self._seq, "head": self._prev, "sig": sig.hex()}) + b"\n"

    def _sign_head(self) -> None:
        atomic_write(head_path(self.path), self._head_bytes(), fsync=self.fsync)


def denial_recorder(log: AuditLog, clock: Callable[[], float]
                    ) -> Callable[[Principal, str, str, str], None]:
    """An ``AccessPolicy`` hook that appends every cross-tenant denial to ``log``."""

    def record(principal: Principal, namespace: str, action: str, reason: str = "") -> None:
        log.append("access.denied", {"tenant": principal.tenant, "subject": principal.subject,
                                     "namespace": namespace[:80], "action": action,
                                     "reason": reason[:120]}, clock())

    return record
