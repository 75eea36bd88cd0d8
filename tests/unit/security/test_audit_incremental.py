"""A writer that finds the audit log grown by another verifies only the new records, and
still refuses a log whose verified part was truncated, rewritten or replaced; each append
makes its records durable with one fsync before the head that vouches for them."""

from __future__ import annotations

import json
import os

import pytest

from security.audit import AuditLog, head_path, verify_log
from security.audit_format import checkpoint_message, record_hash
from security.errors import AuditLogError
from security.signing import Verifier, canonical_json


def bytes_read() -> int:
    """Bytes this process has read through system calls so far (``rchar``)."""
    with open("/proc/self/io", "rb") as fh:
        return int(fh.readline().split()[1])


def _filled(path, signer, n: int) -> None:
    log = AuditLog(path, signer, checkpoint_every=64, fsync=False)
    for i in range(n):
        log.append("erasure", {"tenant": "acme", "i": i}, 1.0 + i)
    log.close(now=float(n + 1))


def test_a_writer_switch_reads_only_what_the_other_writer_appended(tmp_path, signer):
    """It used to re-read and re-verify the whole chain from the start on every switch."""
    path = tmp_path / "audit.log"
    _filled(path, signer, 2000)
    a, b = AuditLog(path, signer, fsync=False), AuditLog(path, signer, fsync=False)
    a.append("admin", {"n": 1}, 5000.0)
    size = path.stat().st_size
    before = bytes_read()
    b.append("admin", {"n": 2}, 5000.0)  # finds the file grown by a
    read = bytes_read() - before
    assert read < size // 20, (read, size)  # a's record and b's own last line, not 0.5 MB
    a.append("admin", {"n": 3}, 5000.0)
    a.close(now=5001.0)
    b.close()
    report = verify_log(path, Verifier(signer.public_raw()))
    assert report.ok, report.problems
    assert [json.loads(line)["data"].get("n") for line in path.read_bytes().splitlines()[-4:]] \
        == [1, 2, 3, None]  # one chain: both writers' records, then a's closing checkpoint


def _rechained(path, signer, keep: int) -> None:
    """The log cut to its first ``keep`` lines plus one forged record chained onto them and a
    head signed over it: a consistent, signed log that rewrote what followed line ``keep``."""
    lines = path.read_bytes().splitlines(keepends=True)[:keep]
    last = json.loads(lines[-1])
    rec = {"seq": last["seq"] + 1, "time": last["time"], "kind": "admin",
           "data": {"forged": "x" * 40}, "prev": last["hash"]}
    rec["hash"] = record_hash(rec["seq"], rec["time"], rec["kind"], rec["data"], rec["prev"])
    with open(path, "r+b") as fh:  # in place: same file, as another writer would see it
        fh.truncate(0)
        fh.write(b"".join(lines) + canonical_json(rec) + b"\n")
    head_path(path).write_bytes(canonical_json({"count": rec["seq"] + 1, "head": rec["hash"],
                                                "sig": signer.sign(checkpoint_message(
                                                    rec["seq"] + 1, rec["hash"])).hex()}) + b"\n")


@pytest.mark.parametrize(("keep", "own"), [(5, False), (9, True)])  # the log shorter; longer
def test_a_verified_record_rewritten_under_a_writer_is_refused(tmp_path, signer, keep, own):
    """Records the writer verified, cut off or replaced by a re-chained forgery (by whoever
    holds the signing key, or with the head left stale), used to be accepted on the next
    re-read, and the writer extended the rewritten history."""
    path = tmp_path / "audit.log"
    _filled(path, signer, 8)  # 9 lines: 8 records and the closing checkpoint
    writer = AuditLog(path, signer, fsync=False)
    if own:  # the writer's own record (line 10) is forged over, with a longer one
        writer.append("admin", {"n": 1}, 100.0)
    _rechained(path, signer, keep)
    forged = path.read_bytes()
    with pytest.raises(AuditLogError, match="no longer where this writer verified it"):
        writer.append("admin", {"n": 2}, 101.0)
    assert path.read_bytes() == forged  # nothing appended
    writer.close()


def test_a_log_replaced_under_a_writer_is_refused(tmp_path, signer):
    """The writer used to go on appending to the file it held open, which no verifier of
    the path reads any more, while the next writer started the replacement's chain."""
    path, other = tmp_path / "audit.log", tmp_path / "other.log"
    _filled(path, signer, 3)
    _filled(other, signer, 3)
    writer = AuditLog(path, signer, fsync=False)
    os.replace(other, path)
    replaced = path.read_bytes()
    with pytest.raises(AuditLogError, match="no longer the file this writer opened"):
        writer.append("admin", {"n": 1}, 10.0)
    assert path.read_bytes() == replaced
    writer.close()


def test_a_break_in_what_another_writer_appended_is_refused(tmp_path, signer):
    path = tmp_path / "audit.log"
    _filled(path, signer, 3)
    a, b = AuditLog(path, signer, fsync=False), AuditLog(path, signer, fsync=False)
    b.append("admin", {"n": 1}, 10.0)
    b.append("admin", {"n": 2}, 11.0)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[-2] = lines[-2].replace(b'"n":1', b'"n":7')  # b's first record, edited
    path.write_bytes(b"".join(lines))
    lineno = len(lines) - 1
    with pytest.raises(AuditLogError, match=f"chain broken at line {lineno}"):
        a.append("admin", {"n": 3}, 12.0)
    a.close()
    b.close()


def test_a_write_cut_short_by_another_writer_is_repaired_by_the_next(tmp_path, signer):
    path = tmp_path / "audit.log"
    _filled(path, signer, 3)
    a, b = AuditLog(path, signer, fsync=False), AuditLog(path, signer, fsync=False)
    b.append("admin", {"n": 1}, 10.0)
    with open(path, "ab") as fh:  # b's next record, cut short by a crash
        fh.write(b'{"data":{"n":2},"hash":"0a')
    a.append("admin", {"n": 3}, 12.0)
    a.close(now=13.0)
    b.close()
    report = verify_log(path, Verifier(signer.public_raw()))
    assert report.ok, report.problems
    kinds = [json.loads(line)["kind"] for line in path.read_bytes().splitlines()[-4:]]
    assert kinds == ["admin", "repair", "admin", "checkpoint"]


class _FsyncCounter:
    def __init__(self, path) -> None:
        self.ino, self.folder_ino = os.stat(path).st_ino, os.stat(path.parent).st_ino
        self.log = self.folder = self.other = 0
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        ino = os.fstat(fd).st_ino
        if ino == self.ino:
            self.log += 1
        elif ino == self.folder_ino:
            self.folder += 1
        else:
            self.other += 1
        self._fsync(fd)


@pytest.mark.parametrize("every", [1, 3])
def test_an_append_makes_its_records_durable_with_one_fsync(tmp_path, signer, monkeypatch, every):
    """A record and the checkpoint it completes are written, then fsynced once, then the
    head is replaced (its new file fsynced, then the folder, so the rename survives a power
    loss), as the service and the CLI log (a checkpoint after each record); it used to be
    one fsync per record, and the rename was never synced."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, signer, checkpoint_every=every)
    counter = _FsyncCounter(path)
    monkeypatch.setattr(os, "fsync", counter)
    for i in range(6):
        log.append("admin", {"i": i}, float(i))
    # per append: the log once, the new head once, the folder once (the rename)
    assert (counter.log, counter.other, counter.folder) == (6, 6, 6)
    monkeypatch.undo()
    log.close()
    assert verify_log(path, Verifier(signer.public_raw())).ok
