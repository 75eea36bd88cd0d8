"""Tiers that run before the keys go (the admin CLI's directory step), and the receipt's
time when another writer stamps the log later while the tiers run."""

from __future__ import annotations

import pytest

from security.audit import AuditLog
from security.audit_format import read_records
from security.erasure import Eraser, unfinished_erasures, verify_receipt
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Verifier
from tests.unit.security.test_erasure_unfinished import killed_erasure


class _Killed(BaseException):
    """The erasing process dies here."""


def _kinds(path):
    return [rec["kind"] for _n, rec in read_records(path) if isinstance(rec, dict)]


def test_a_before_keys_tier_runs_after_the_begun_record_and_before_any_key_goes(
        tmp_path, keyring, signer):
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1000)
    seen = []

    def directory(_scope) -> int:
        seen.append((_kinds(log), keyring.has_keys("alice"), keyring.erasures()))
        return 7

    eraser = Eraser(keyring, audit, signer)
    eraser.register_tier("hbm", lambda _scope: 2)
    eraser.register_tier("directory", directory, before_keys=True)
    receipt = eraser.erase_tenant("alice", now=2.0)
    audit.close()
    assert seen == [(["erasure.begun"], True, {})]  # recorded first, nothing destroyed yet
    assert receipt.counts == (("hbm", 2), ("directory", 7))  # in registration order
    assert not keyring.has_keys("alice") and unfinished_erasures(log) == []


def test_a_process_killed_after_its_directory_step_leaves_an_unfinished_erasure(
        tmp_path, keyring, signer):
    """`tenant erase --redis-url` killed right after it deleted the tenant's directory
    namespace: the step ran before anything was recorded, so the log (and `audit verify`,
    `audit erased --log`) said nothing of the tombstoned namespace of a live tenant."""
    log = tmp_path / "audit.log"
    planned = keyring.tenant_key_ids("alice")

    def killed(_scope) -> int:
        raise _Killed

    audit = AuditLog(log, signer, checkpoint_every=1000)
    eraser = Eraser(keyring, audit, signer)
    eraser.register_tier("directory", killed, before_keys=True)
    with pytest.raises(_Killed):
        eraser.erase_tenant("alice", now=2.0)
    audit.close()
    [begun] = unfinished_erasures(log)
    assert (begun.tenant, begun.generation, begun.key_ids) == ("alice", None, tuple(planned))
    assert keyring.has_keys("alice") and keyring.erasures() == {}  # keys intact, no mark

    audit = AuditLog(log, signer, checkpoint_every=1000)
    rerun = Eraser(TenantKeyring(FileKeySource(tmp_path / "keys")), audit, signer)
    rerun.register_tier("directory", lambda _scope: 0, before_keys=True)
    receipt = rerun.erase_tenant("alice", now=3.0)
    audit.close()
    assert receipt.key_ids == tuple(planned) and unfinished_erasures(log) == []


def test_a_resumed_erasure_runs_its_before_keys_tier_first_and_stops_on_its_failure(
        tmp_path, keyring, signer, monkeypatch):
    """Keys gone, end unrecorded: the directory step (named by the marks) runs again, and
    its failure leaves the erasure unfinished rather than signing a receipt without it."""
    log = tmp_path / "audit.log"
    killed_erasure(monkeypatch, log, keyring, signer, (Eraser, "_finish"),
                   lambda eraser: eraser.erase_tenant("alice", now=2.0))
    audit = AuditLog(log, signer, checkpoint_every=1000)
    eraser = Eraser(keyring, audit, signer)
    eraser.register_tier("directory", lambda _scope: (_ for _ in ()).throw(OSError("down")),
                         before_keys=True)
    with pytest.raises(OSError, match="down"):
        eraser.erase_tenant("alice", now=3.0)
    assert [b.tenant for b in unfinished_erasures(log)] == ["alice"]
    eraser = Eraser(keyring, audit, signer)
    eraser.register_tier("directory", lambda _scope: 4, before_keys=True)
    receipt = eraser.erase_tenant("alice", now=4.0)
    audit.close()
    assert receipt.counts == (("directory", 4),) and unfinished_erasures(log) == []


def test_the_mark_takes_the_clock_after_the_before_keys_tiers(tmp_path, keyring, signer):
    """A directory step may retry for a minute: a token issued meanwhile must be older
    than the tenant's erasure mark."""
    clock = iter([50.0])
    audit = AuditLog(tmp_path / "audit.log", signer, checkpoint_every=1000)
    eraser = Eraser(keyring, audit, signer, clock=lambda: next(clock))
    eraser.register_tier("directory", lambda _scope: 0, before_keys=True)
    eraser.erase_tenant("alice", now=2.0)
    audit.close()
    assert keyring.erased_at("alice") == 50.0


def test_the_receipt_time_is_the_time_its_record_holds(tmp_path, keyring, signer):
    """Another writer (the service's request threads) appended a record stamped later
    while the tiers ran: the log moved the erasure record's time up to it, the receipt
    kept the time it was given, and `reissue` (which signs the record's time) did not
    give the same receipt back, contrary to its contract."""
    log = tmp_path / "audit.log"
    mine = AuditLog(log, signer, checkpoint_every=1)
    other = AuditLog(log, signer, checkpoint_every=1)
    eraser = Eraser(keyring, mine, signer)
    eraser.register_tier("hbm", lambda _scope: (other.append("access.denied", {"x": 1}, 7.0),
                                                3)[1])
    receipt = eraser.erase_tenant("alice", now=2.0)
    [record] = [rec for _n, rec in read_records(log)
                if isinstance(rec, dict) and rec["seq"] == receipt.audit_seq]
    assert record["kind"] == "erasure" and receipt.time == record["time"] == 7.0
    assert eraser.reissue("alice") == receipt
    verify_receipt(receipt.to_json(), Verifier(signer.public_raw()))
    mine.close()
    other.close()
