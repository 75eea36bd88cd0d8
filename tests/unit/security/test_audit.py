"""Acceptance 7: every kind of audit-log tampering is detected offline with only the public key."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import threading
import time

import pytest

from security.audit import AuditLog, AuditPosition, head_path, verify_log
from security.errors import AuditLogError
from security.signing import Signer, Verifier, canonical_json


@pytest.fixture
def log(tmp_path, signer):
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=4, fsync=False)  # durability is not under test
    positions = [audit.append("key.create" if i % 2 else "access.denied", {"tenant": "acme", "i": i},
                              100.0 + i) for i in range(10)]
    audit.close(now=200.0)
    return path, Verifier(signer.public_raw()), positions


def _lines(path):
    return path.read_bytes().splitlines(keepends=True)


def _write(path, lines):
    path.write_bytes(b"".join(lines))


def test_untouched_log_verifies(log):
    path, verifier, positions = log
    report = verify_log(path, verifier, anchors=positions)
    assert report.ok, report.problems
    assert (report.records, report.checkpoints) == (13, 3)  # 10 records + checkpoints at 4, 8, close


def test_other_public_key_fails(log):
    path, _, _ = log
    report = verify_log(path, Verifier(Signer.generate().public_raw()))
    assert not report.ok and "signature does not verify" in report.problems[0]


def _edit(lines):
    rec = json.loads(lines[2])
    rec["data"]["tenant"] = "evil"
    lines[2] = canonical_json(rec) + b"\n"
    return lines


def _edit_and_rehash(lines):
    from security.audit_format import record_hash

    rec = json.loads(lines[2])
    rec["data"]["tenant"] = "evil"
    rec["hash"] = record_hash(rec["seq"], rec["time"], rec["kind"], rec["data"], rec["prev"])
    lines[2] = canonical_json(rec) + b"\n"
    return lines


def _append_chained(lines):
    from security.audit_format import record_hash

    last = json.loads(lines[-1])
    rec = {"seq": last["seq"] + 1, "time": last["time"], "kind": "admin", "data": {"fake": 1},
           "prev": last["hash"]}
    rec["hash"] = record_hash(rec["seq"], rec["time"], rec["kind"], rec["data"], rec["prev"])
    return lines + [canonical_json(rec) + b"\n"]


TAMPERING = {
    "append a correctly chained forged record": (_append_chained, "not covered by a signature"),
    "edit a field": (_edit, "edited"),
    "edit and recompute the hash": (_edit_and_rehash, "link to the previous record is broken"),
    "delete a record": (lambda ls: ls[:3] + ls[4:], "seq 4 where 3 was expected"),
    "swap two records": (lambda ls: ls[:2] + [ls[3], ls[2]] + ls[4:], "seq 3 where 2 was expected"),
    "duplicate a record": (lambda ls: ls[:3] + [ls[2]] + ls[3:], "seq 2 where 3 was expected"),
    "truncate the tail": (lambda ls: ls[:-2], "truncated: signed head has 13 records, log has 11"),
    "cut a line in half": (lambda ls: ls[:-1] + [ls[-1][:40]], "line 13: last line is incomplete"),
    "append an unsigned record": (lambda ls: ls + [ls[-1]], "seq 12 where 13 was expected"),
    "flip one byte": (lambda ls: ls[:5] + [ls[5].replace(b'"i":', b'"j":')] + ls[6:], "edited"),
    "replace a checkpoint signature": (
        lambda ls: ls[:4] + [ls[4].replace(b'"sig":"', b'"sig":"00')] + ls[5:], "edited"),
    "empty the log": (lambda ls: [], "truncated"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_tampering_is_detected(log, kind):
    path, verifier, _ = log
    change, message = TAMPERING[kind]
    _write(path, change(_lines(path)))
    report = verify_log(path, verifier)
    assert not report.ok
    assert any(message in p for p in report.problems), report.problems


def test_rollback_of_log_and_head_is_detected_against_an_anchor(tmp_path, signer):
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=1)
    audit.append("key.create", {"tenant": "acme"}, 1.0)
    shutil.copy(path, tmp_path / "old.log")
    shutil.copy(head_path(path), tmp_path / "old.log.head")
    erased = audit.append("erasure", {"tenant": "acme"}, 2.0)  # the position a receipt carries
    audit.close()
    verifier = Verifier(signer.public_raw())
    assert verify_log(path, verifier, anchors=[erased]).ok
    shutil.copy(tmp_path / "old.log", path)  # roll both files back to a consistent, signed state
    shutil.copy(tmp_path / "old.log.head", head_path(path))
    assert verify_log(path, verifier).ok  # consistent on its own: that is what a rollback is
    report = verify_log(path, verifier, anchors=[erased])
    assert not report.ok and report.problems == (f"rollback: anchored record seq {erased.seq} is not in the log",)
    forged = AuditPosition(seq=0, hash="f" * 64)
    assert not verify_log(path, verifier, anchors=[forged]).ok


def test_refuses_to_extend_a_log_shorter_than_its_signed_head(log, signer):
    """A truncated log next to its head file fails ``verify_log``; the next writer used to
    append and sign a new head over the cut chain, after which it verified again with the
    cut-off records (an erasure's among them) gone."""
    path, verifier, _ = log
    _write(path, _lines(path)[:4])
    assert any("truncated" in p for p in verify_log(path, verifier).problems)
    with pytest.raises(AuditLogError, match="holds 4 records, its signed head 13: it was truncated"):
        AuditLog(path, signer, fsync=False)
    assert len(_lines(path)) == 4 and not verify_log(path, verifier).ok  # untouched
    _write(path, [])
    with pytest.raises(AuditLogError, match="truncated"):
        AuditLog(path, signer, fsync=False)


def test_missing_or_forged_head_file(log, signer):
    path, verifier, _ = log
    head = head_path(path)
    saved = head.read_bytes()
    head.unlink()
    assert "missing" in verify_log(path, verifier).problems[0]
    rec = json.loads(saved)
    rec["count"] = 99
    head.write_text(json.dumps(rec))
    assert verify_log(path, verifier).problems == ("head file signature does not verify",)
    head.write_text("{not json")
    assert verify_log(path, verifier).problems[0].endswith("is malformed")


def test_time_going_backwards_is_refused_and_detected(tmp_path, signer):
    audit = AuditLog(tmp_path / "a.log", signer)
    audit.append("admin", {"x": 1}, 10.0)
    with pytest.raises(ValueError, match="backwards"):
        audit.append("admin", {"x": 2}, 9.0)
    audit.close()


def test_a_time_taken_before_another_threads_append_is_not_a_clock_going_back(tmp_path,
                                                                              signer):
    """The service shares one writer among threads: an erasure takes its time, then runs
    for seconds while request threads append denials with later times. Its end record was
    refused as "time went backwards", so the erasure (keys already destroyed) signed no
    receipt. A thread's own clock still may not go back; a time behind another thread's
    record takes that record's time, as one behind another writer's does."""
    audit = AuditLog(tmp_path / "a.log", signer)
    audit.append("erasure.begun", {"n": 1}, 10.0)
    other = threading.Thread(target=audit.append, args=("access.denied", {"n": 2}, 20.0))
    other.start()
    other.join()
    pos = audit.append("erasure.done", {"n": 3}, 10.0)  # this thread's clock: still 10
    assert pos.seq == 2
    audit.append("page_retired", {"n": 3.5}, 10.0)  # reused after its record moved to 20
    with pytest.raises(ValueError, match="backwards"):
        audit.append("admin", {"n": 4}, 9.0)
    audit.close(now=30.0)
    times = [json.loads(line)["time"] for line in (tmp_path / "a.log").read_text().splitlines()]
    assert times[:4] == [10.0, 20.0, 20.0, 20.0]
    assert verify_log(tmp_path / "a.log", Verifier(signer.public_raw())).ok


def test_reopen_continues_the_chain(tmp_path, signer):
    path = tmp_path / "a.log"
    first = AuditLog(path, signer, checkpoint_every=100)
    first.append("admin", {"n": 1}, 1.0)
    first.close()
    second = AuditLog(path, signer, checkpoint_every=100)
    pos = second.append("admin", {"n": 2}, 2.0)
    second.close(now=3.0)
    assert pos.seq == 1
    assert verify_log(path, Verifier(signer.public_raw())).ok


@pytest.mark.parametrize("checkpointed", [True, False])
def test_refuses_to_append_with_another_signing_key(tmp_path, signer, checkpointed):
    """A writer with another key would sign checkpoints and a head that the log's public
    key rejects, and the log would verify under neither key: it is refused, and the log
    still verifies. Caught by the last checkpoint's key id, or else by the head file."""
    path = tmp_path / "a.log"
    first = AuditLog(path, signer, checkpoint_every=1 if checkpointed else 100, fsync=False)
    first.append("admin", {"n": 1}, 1.0)
    first.close()
    with pytest.raises(AuditLogError, match="signed with another key"):
        AuditLog(path, Signer.generate())
    assert verify_log(path, Verifier(signer.public_raw())).ok
    again = AuditLog(path, signer, fsync=False)  # its own key still appends
    again.append("admin", {"n": 2}, 2.0)
    again.close(now=3.0)
    assert verify_log(path, Verifier(signer.public_raw())).ok


def test_refuses_to_append_to_a_broken_log(log, signer):
    path, _, _ = log
    _write(path, _edit(_lines(path)))
    with pytest.raises(AuditLogError, match="chain broken at line 3"):
        AuditLog(path, signer)


@pytest.mark.parametrize(("kind", "data"), [("checkpoint", {}), ("Bad Kind", {}), ("", {}),
                                            ("admin", {"blob": "x" * 70_000})])
def test_bad_records_are_refused(tmp_path, signer, kind, data):
    audit = AuditLog(tmp_path / "a.log", signer)
    with pytest.raises(ValueError):
        audit.append(kind, data, 1.0)
    audit.close()
    assert (tmp_path / "a.log").read_bytes() == b""


def test_cross_tenant_denials_are_recorded(tmp_path, signer):
    from security.audit import denial_recorder
    from security.errors import AccessDenied
    from security.principals import AccessPolicy, TokenIssuer

    path = tmp_path / "a.log"
    audit = AuditLog(path, signer, checkpoint_every=1)
    clock = iter([5.0, 6.0]).__next__
    policy = AccessPolicy(on_denied=denial_recorder(audit, clock))
    issuer = TokenIssuer(b"k" * 32)
    acme = issuer.verify(issuer.issue("acme", subject="svc", now=0.0), 1.0)
    for action in ("read", "write"):
        with pytest.raises(AccessDenied):
            policy.check(acme, "globex", action)
    audit.close()
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    denied = [r for r in records if r["kind"] == "access.denied"]
    assert [(r["time"], r["data"]["namespace"], r["data"]["action"]) for r in denied] == [
        (5.0, "globex", "read"), (6.0, "globex", "write")]
    assert verify_log(path, Verifier(signer.public_raw())).ok


def _append_many(path: str, signer: Signer, worker: int, n: int) -> None:
    log = AuditLog(path, signer, checkpoint_every=7, fsync=False)
    for i in range(n):  # the time is read before the lock: the other may write later times
        log.append("erasure", {"worker": worker, "i": i}, time.time())
    log.close(time.time())


def test_two_writer_processes_extend_one_chain_without_forking_it(tmp_path, signer):
    path = tmp_path / "shared.log"
    AuditLog(path, signer).close()
    ctx = multiprocessing.get_context("fork")  # the children inherit the signing key
    procs = [ctx.Process(target=_append_many, args=(str(path), signer, w, 40)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    report = verify_log(path, Verifier(signer.public_raw()))
    assert report.ok, report.problems
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds.count("erasure") == 80  # every append of both writers, on one chain


def test_anchor_from_another_log_is_named_as_such(tmp_path, signer):
    """A receipt of another service (same key, its own log) anchors a seq this log has,
    with another record there: not reported as missing, but as a different record."""
    ours, theirs = AuditLog(tmp_path / "a.log", signer), AuditLog(tmp_path / "b.log", signer)
    for log_ in (ours, theirs):
        log_.append("key.create", {"tenant": "acme"}, 1.0)
    erased = theirs.append("erasure", {"tenant": "acme"}, 2.0)
    ours.append("erasure", {"tenant": "globex"}, 2.0)
    ours.close()
    theirs.close()
    report = verify_log(tmp_path / "a.log", Verifier(signer.public_raw()), anchors=[erased])
    expected = (f"anchored record seq {erased.seq} is another record in this log (the log "
                "was rewritten, or the anchor comes from another log)")
    assert not report.ok and report.problems == (expected,)


def test_a_line_or_head_nested_past_the_parser_stack_is_a_finding(log):
    """It used to end ``verify_log`` (and ``agentkv audit verify``) with a RecursionError."""
    path, verifier, _ = log
    deep = b"[" * 100_000 + b"]" * 100_000
    lineno = len(_lines(path)) + 1
    _write(path, _lines(path) + [deep + b"\n"])
    report = verify_log(path, verifier)
    assert not report.ok and report.problems == (f"line {lineno}: not a JSON record (edited or cut)",)
    _write(path, _lines(path)[:-1])
    head_path(path).write_bytes(deep)
    report = verify_log(path, verifier)
    assert not report.ok and report.problems == (f"head file {head_path(path)} is malformed",)


def _retenant(line: bytes) -> bytes:
    """The record with a first ``tenant`` key naming another tenant: a reader of the text
    (grep) sees it, the JSON parser keeps the last one, so the hash still matches."""
    return line.replace(b'"data":{', b'"data":{"tenant":"globex",', 1)


REFORMATTED = {
    "duplicate key naming another tenant": lambda ls: ls[:2] + [_retenant(ls[2])] + ls[3:],
    "spaces added": lambda ls: ls[:2] + [ls[2].replace(b'":', b'": ')] + ls[3:],
    "keys reordered": lambda ls: ls[:2] + [_reordered(ls[2])] + ls[3:],
    "CRLF line ending": lambda ls: ls[:2] + [ls[2][:-1] + b"\r\n"] + ls[3:],
}


def _reordered(line: bytes) -> bytes:
    rec = json.loads(line)
    return json.dumps(dict(reversed(rec.items())), separators=(",", ":")).encode() + b"\n"


@pytest.mark.parametrize("kind", sorted(REFORMATTED))
def test_a_line_rewritten_in_another_form_is_detected(log, kind):
    """The hash covers the parsed record: these edits used to verify as OK."""
    path, verifier, _ = log
    _write(path, REFORMATTED[kind](_lines(path)))
    report = verify_log(path, verifier)
    assert not report.ok
    expected = ("line 3: record is not in the form the writer writes (edited: spacing, key "
                "order, a duplicate key or the line ending changed)")
    assert report.problems == (expected,)


def test_a_last_line_without_its_newline_is_a_finding_and_refused(log, signer):
    """Appending to it used to merge the next record into that line, breaking the chain."""
    path, verifier, _ = log
    cut = path.read_bytes()[:-1]
    path.write_bytes(cut)
    report = verify_log(path, verifier)
    lineno = len(_lines(path))
    assert not report.ok and report.problems == (
        f"line {lineno}: last line is incomplete, no newline (a write cut short, or edited)",)
    with pytest.raises(AuditLogError, match=f"chain broken at line {lineno}: last line is incomplete"):
        AuditLog(path, signer)
    assert path.read_bytes() == cut  # nothing appended


def test_a_head_file_that_cannot_be_read_is_a_finding(log):
    """It used to raise IsADirectoryError (the CLI then blamed the log file)."""
    path, verifier, _ = log
    head_path(path).unlink()
    head_path(path).mkdir()
    report = verify_log(path, verifier)
    assert not report.ok and report.problems == (
        f"head file {head_path(path)} cannot be read (Is a directory)",)


def test_a_negative_anchor_is_not_read_from_the_end(log):
    """``hashes[-1]`` is the last record: seq -1 with its hash used to pass as an anchor."""
    path, verifier, _ = log
    last = verify_log(path, verifier).head
    report = verify_log(path, verifier, anchors=[AuditPosition(seq=-1, hash=last)])
    assert not report.ok and report.problems == ("anchor seq -1 is negative: no record has it",)


def test_a_log_checked_with_another_public_key_names_both_keys(log, signer):
    from security.signing import fingerprint

    path, _, _ = log
    other = Signer.generate()
    report = verify_log(path, Verifier(other.public_raw()))
    expected = (f"seq 4: checkpoint signature does not verify: it names key "
                f"{fingerprint(signer.public_raw())}, the public key given is "
                f"{fingerprint(other.public_raw())} (wrong --public-key, or forged)")
    assert not report.ok and report.problems == (expected,)


def test_data_that_json_changes_is_hashed_as_read_back(tmp_path, signer):
    """Int keys sort as numbers when written and as strings when read back: the record's
    hash used to be taken over the former, so the untouched log failed to verify."""
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, fsync=False)
    audit.append("erasure", {"counts": {2: 1, 10: 3}, "tiers": ("host", "nvme")}, 1.0)
    audit.close(2.0)
    report = verify_log(path, Verifier(signer.public_raw()))
    assert report.ok, report.problems
    assert json.loads(path.read_bytes().splitlines()[0])["data"] == {
        "counts": {"10": 3, "2": 1}, "tiers": ["host", "nvme"]}


def test_a_record_a_crash_cut_short_is_dropped_and_the_repair_is_in_the_chain(log, signer):
    """A write cut short leaves bytes without a newline after the last committed record;
    the head file, written after each record, still vouches for the chain before them. The
    next writer cuts them off and says so in a ``repair`` record, and the log verifies
    (before, every writer refused it until an operator edited the file)."""
    path, verifier, _ = log
    whole = path.read_bytes()
    torn = b'{"data":{"i":10,"tenant":"acme"},"hash":"ab'  # half of a record, no newline
    path.write_bytes(whole + torn)
    assert not verify_log(path, verifier).ok  # a finding until a writer repairs it
    audit = AuditLog(path, signer, fsync=False)
    audit.append("key.create", {"tenant": "acme", "i": 10}, 300.0)
    audit.close(now=301.0)
    report = verify_log(path, verifier)
    assert report.ok, report.problems
    assert path.read_bytes().startswith(whole) and torn not in path.read_bytes()
    repair = json.loads(_lines(path)[len(whole.splitlines())])
    assert repair["kind"] == "repair" and repair["data"]["dropped_bytes"] == len(torn)


def test_torn_bytes_the_signed_head_does_not_vouch_for_are_refused(log, signer):
    """Bytes without a newline after a record the head does not end at (the head moved
    on: those bytes were a committed record, now edited) are refused, not cut off."""
    path, _, _ = log
    lines = _lines(path)
    edited = b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]  # half of the last one
    path.write_bytes(edited)
    with pytest.raises(AuditLogError, match="signed head does not end the chain"):
        AuditLog(path, signer)
    assert path.read_bytes() == edited  # nothing cut, nothing appended

