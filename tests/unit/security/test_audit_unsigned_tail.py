"""Records after the signed head that no signature covers. Anyone who can write the log
file (not the key) could append a correctly chained record, an ``erasure`` of a tenant
never erased, say: ``verify_log`` named it, and then the next writer signed a new head
over it, after which the log verified and ``tenant erase`` signed a receipt from it. A
writer now refuses such a chain. A writer cut off between writing its records and
vouching for them leaves ``LOG.head.next``, signed before the records were written, which
the next writer checks and finishes."""

from __future__ import annotations

import json

import pytest

from security.audit import AuditLog, head_path, verify_log
from security.audit_format import (
    checkpoint_message,
    pending_head_path,
    read_records,
    record_hash,
)
from security.erasure import Eraser
from security.errors import AuditLogError
from security.signing import Signer, Verifier, canonical_json


def _records(path):
    return [rec for _n, rec in read_records(path) if isinstance(rec, dict)]


def _forge(path, kind: str, data: dict) -> None:
    """Append a record chained to the last one, as anyone who can write the file can."""
    last = _records(path)[-1]
    seq, time = last["seq"] + 1, last["time"] + 1.0
    line = {"seq": seq, "time": time, "kind": kind, "data": data, "prev": last["hash"],
            "hash": record_hash(seq, time, kind, data, last["hash"])}
    with open(path, "ab") as fh:
        fh.write(canonical_json(line) + b"\n")


@pytest.fixture
def written(tmp_path, signer):
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=1000, fsync=False)
    for i in range(3):
        audit.append("key.create", {"tenant": f"t{i}", "generation": 1}, 10.0 + i)
    return path, audit


FORGED = {"tenant": "globex", "scope": "tenant", "generation": None,
          "key_ids": ["globex/g1/0000000000000000"], "counts": [["nvme", 9]],
          "failed_tiers": [], "begun": 0}


def test_a_forged_record_is_not_signed_over_by_the_next_writer(written, signer):
    path, running = written
    _forge(path, "erasure", FORGED)
    verifier = Verifier(signer.public_raw())
    assert "not covered by a signature" in verify_log(path, verifier).problems[0]
    with pytest.raises(AuditLogError, match="its signed head covers 3: the records after it "
                                            "were not appended by a writer"):
        AuditLog(path, signer, fsync=False)  # a new writer (the CLI)
    with pytest.raises(AuditLogError, match="refusing to sign over them"):
        running.append("access.denied", {"n": 1}, 20.0)  # a running one (the service)
    assert not verify_log(path, verifier).ok  # still named, never vouched for
    assert len(_records(path)) == 4  # nothing appended over it


def test_an_erase_of_a_tenant_without_keys_signs_no_receipt_from_a_forged_record(
        written, signer, keyring):
    path, running = written
    running.close()
    _forge(path, "erasure", FORGED)
    with pytest.raises(AuditLogError, match="refusing to sign over them"):
        Eraser(keyring, AuditLog(path, signer, fsync=False), signer).erase_tenant("globex", 30.0)


def test_a_log_whose_head_file_was_deleted_is_not_signed_anew(written, signer):
    path, running = written
    running.close()
    head_path(path).unlink()
    with pytest.raises(AuditLogError, match="no signed head"):
        AuditLog(path, signer, fsync=False)


def test_a_writer_cut_off_before_its_rename_is_finished_by_the_next(written, signer):
    """The state a kill between the records' fsync and the rename leaves: the old head,
    the new records, and LOG.head.next vouching for them."""
    path, running = written
    old_head = head_path(path).read_bytes()
    running.append("erasure.begun", {"tenant": "t0"}, 20.0)
    running.close()
    pending_head_path(path).write_bytes(head_path(path).read_bytes())
    head_path(path).write_bytes(old_head)
    verifier = Verifier(signer.public_raw())
    assert verify_log(path, verifier).ok  # LOG.head.next vouches for the last record
    again = AuditLog(path, signer, fsync=False)
    assert not pending_head_path(path).exists() and head_path(path).read_bytes() != old_head
    again.append("erasure", {"tenant": "t0"}, 21.0)
    again.close()
    assert verify_log(path, verifier).ok and len(_records(path)) == 5


def test_a_pending_head_of_records_never_written_is_ignored(written, signer):
    """Cut off after signing LOG.head.next and before writing the records: nothing of it
    is in the log, and the pending head vouches for a chain end that is not there."""
    path, running = written
    running.close()
    other = Signer.generate()  # a pending head can only vouch with the log's key, too
    for key in (signer, other):
        sig = key.sign(checkpoint_message(4, "f" * 64)).hex()
        pending_head_path(path).write_bytes(canonical_json(
            {"count": 4, "head": "f" * 64, "sig": sig}) + b"\n")
        audit = AuditLog(path, signer, fsync=False)
        audit.append("key.create", {"tenant": "t9", "generation": 1}, 30.0)
        audit.close()
    assert verify_log(path, Verifier(signer.public_raw())).ok


def test_each_commit_leaves_no_pending_head(written):
    path, running = written
    running.append("access.denied", {"n": 1}, 20.0)
    assert not pending_head_path(path).exists()


@pytest.mark.parametrize("cut", ["inside the record", "after the record", "inside its checkpoint"])
def test_a_call_cut_short_part_way_through_its_records_is_cut_back(tmp_path, signer, cut):
    """One call writes a record and its checkpoint in one write; a kill (or a short write
    stopping at a page boundary) left the record whole and the checkpoint cut, or cut at
    the line between them: every writer refused the log for good (1 in 170 kills). The
    call never returned: its lines are cut back to the signed head, with a repair record."""
    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer, checkpoint_every=2, fsync=False)
    audit.append("key.create", {"tenant": "t0", "generation": 1}, 10.0)
    before, head_before = path.read_bytes(), head_path(path).read_bytes()
    audit.append("key.create", {"tenant": "t1", "generation": 1}, 11.0)  # + its checkpoint
    audit.close()
    after, head_after = path.read_bytes(), head_path(path).read_bytes()
    record, checkpoint = after[len(before):].splitlines(keepends=True)
    keep = {"inside the record": len(record) // 2, "after the record": len(record),
            "inside its checkpoint": len(record) + len(checkpoint) // 2}[cut]
    path.write_bytes(after[:len(before) + keep])
    head_path(path).write_bytes(head_before)
    pending_head_path(path).write_bytes(head_after)  # signed before the call wrote
    again = AuditLog(path, signer, fsync=False)
    again.append("key.create", {"tenant": "t2", "generation": 1}, 12.0)
    again.close()
    recs = _records(path)
    assert [r["kind"] for r in recs] == ["key.create", "repair", "key.create"]
    repair = {"dropped_bytes": keep, "reason": "a write cut short"}
    if keep >= len(record):  # (inside the record: the head vouches for all before it)
        repair["dropped_records"] = 1
    assert recs[1]["data"] == repair
    assert verify_log(path, Verifier(signer.public_raw())).ok


def test_a_cut_without_a_pending_head_is_still_refused(written, signer):
    """Records after the head with no pending head that claims more: not a cut call."""
    path, running = written
    running.close()
    _forge(path, "erasure", FORGED)
    pending_head_path(path).unlink(missing_ok=True)
    with pytest.raises(AuditLogError, match="refusing to sign over them"):
        AuditLog(path, signer, fsync=False)


def test_an_empty_log_beside_a_head_it_did_not_sign_is_not_called_truncated(written, signer):
    """On an empty log the head's count was trusted before its signature: a head file
    written by hand (or by another key) had the writer report a truncation it could not
    know of. Refused still, and named for what it is."""
    path, running = written
    running.close()
    path.write_bytes(b"")
    head = head_path(path)
    real = head.read_text()
    forged = json.loads(real)
    forged["sig"] = "00" * 64
    head.write_text(json.dumps(forged) + "\n")
    with pytest.raises(AuditLogError, match="head file that this writer's key .* did not sign") as err:
        AuditLog(path, signer, fsync=False)
    assert "truncated" not in str(err.value)
    head.write_text(real)
    with pytest.raises(AuditLogError, match="did not sign"):
        AuditLog(path, Signer.generate(), fsync=False)  # a real head, another writer's key
