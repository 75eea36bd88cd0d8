"""A line of the audit log longer than ``MAX_LINE_BYTES`` (or a head file longer than
``MAX_HEAD_BYTES``) is a typed finding naming where it starts, found without reading
past the bound: a corrupt or hostile multi-GB line used to be read into memory whole."""

from __future__ import annotations

import os

import pytest

from security.audit import AuditLog, head_path, verify_log
from security.audit_format import MAX_LINE_BYTES
from security.errors import AuditLogError, AuditRecordTooLarge
from security.signing import Verifier

HUGE = 64 << 20  # a sparse run of zero bytes, no newline in it


def bytes_read() -> int:
    """Bytes this process has read through system calls so far (``rchar``)."""
    with open("/proc/self/io", "rb") as fh:
        return int(fh.readline().split()[1])


@pytest.fixture
def log(tmp_path, signer):
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=4, fsync=False)
    for i in range(6):
        audit.append("erasure", {"tenant": "acme", "i": i}, 1.0 + i)
    audit.close(now=10.0)
    lines = path.read_bytes().count(b"\n")
    return path, Verifier(signer.public_raw()), lines, path.stat().st_size


def _expected(lineno: int, offset: int) -> str:
    return (f"line {lineno} (byte offset {offset}) is longer than the maximum record line of "
            f"{MAX_LINE_BYTES} bytes (corrupt or hostile); not read further")


def test_an_endless_last_line_is_a_finding_read_only_to_the_bound(log):
    path, verifier, lines, size = log
    os.truncate(path, size + HUGE)
    before = bytes_read()
    report = verify_log(path, verifier)
    read = bytes_read() - before
    assert not report.ok and report.problems == (_expected(lines + 1, size),)
    assert report.records == lines
    assert read < 2 * MAX_LINE_BYTES, read  # it used to read all 64 MiB


def test_a_long_line_inside_the_log_is_a_finding_and_nothing_after_it_is_read(log):
    path, verifier, _, _ = log
    whole = path.read_bytes()
    with open(path, "r+b") as fh:  # a 64 MiB line (ending in a newline) after line 3
        cut = sum(len(line) for line in whole.splitlines(keepends=True)[:3])
        fh.truncate(cut)
        fh.seek(cut + HUGE)
        fh.write(b"\n" + whole[cut:])
    before = bytes_read()
    report = verify_log(path, verifier)
    assert bytes_read() - before < 2 * MAX_LINE_BYTES
    assert not report.ok and report.problems == (_expected(4, cut),)
    assert report.records == 3


def test_a_writer_refuses_an_endless_line_with_a_typed_error_and_changes_nothing(log, signer):
    """It used to read it whole and then, as the head vouches for the chain before it, cut
    all 64 MiB off as a write a crash had cut short: no crash writes more than a record."""
    path, _, lines, size = log
    os.truncate(path, size + HUGE)
    with pytest.raises(AuditRecordTooLarge) as caught:
        AuditLog(path, signer)
    assert (caught.value.lineno, caught.value.offset) == (lines + 1, size)
    assert str(caught.value) == f"{path}: {_expected(lines + 1, size)}"
    assert isinstance(caught.value, AuditLogError)  # what callers of the writer catch
    assert path.stat().st_size == size + HUGE  # nothing cut, nothing appended


def test_an_endless_line_another_writer_left_is_refused_on_the_next_append(log, signer):
    path, _, lines, size = log
    writer = AuditLog(path, signer, fsync=False)
    os.truncate(path, size + HUGE)
    before = bytes_read()
    with pytest.raises(AuditRecordTooLarge, match=f"line {lines + 1} \\(byte offset {size}\\)"):
        writer.append("admin", {"n": 1}, 20.0)
    assert bytes_read() - before < 2 * MAX_LINE_BYTES
    assert path.stat().st_size == size + HUGE
    writer.close()


def test_a_huge_head_file_is_malformed_and_read_only_to_its_bound(log):
    path, verifier, _, _ = log
    head = head_path(path)
    os.truncate(head, HUGE)
    before = bytes_read()
    report = verify_log(path, verifier)
    assert bytes_read() - before < MAX_LINE_BYTES
    assert not report.ok and report.problems == (f"head file {head} is malformed",)


def test_the_longest_record_the_writer_accepts_is_well_inside_the_bound(tmp_path, signer):
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=1, fsync=False)
    audit.append("admin", {"blob": "\u00ff" * 10_000, "pad": "x" * 5_000}, 1.0)  # escaped: 65 KB
    audit.close()
    longest = max(len(line) for line in path.read_bytes().splitlines(keepends=True))
    assert 60_000 < longest < MAX_LINE_BYTES // 8
    assert verify_log(path, Verifier(signer.public_raw())).ok


def test_the_refusal_crosses_processes_intact(tmp_path) -> None:
    import pickle

    err = AuditRecordTooLarge(7, 4096, MAX_LINE_BYTES, tmp_path / "audit.log")
    again = pickle.loads(pickle.dumps(err))
    assert (again.lineno, again.offset, again.limit, again.path, str(again)) == \
        (7, 4096, MAX_LINE_BYTES, err.path, str(err))
