"""An erasure on a disk that fills: the audit log records it before any key goes, an
append the disk refuses leaves the log as it was, and an erasure whose end the log refused
is finished by running it again (a real tmpfs, filled to its last block)."""

from __future__ import annotations

import pytest

from security.audit import AuditLog, verify_log
from security.audit_format import read_records
from security.erasure import Eraser, unfinished_erasures, verify_receipt
from security.errors import ErasureUnrecorded, InvalidSeal, KeyUnavailable
from security.key_sources import LocalKeyWrapper, WrappedKeySource
from security.keyring import FileKeySource, TenantKeyring
from security.publishing import PublishGrants
from security.signing import Verifier
from tests.support.tmpfs import fill, tmpfs

DIGEST = b"z" * 32


def _kinds(path):
    return [rec["kind"] for _n, rec in read_records(path) if isinstance(rec, dict)]


@pytest.fixture
def disk(tmp_path):
    with tmpfs(tmp_path / "fs", 1 << 20) as fs:
        yield fs


def test_the_begun_record_names_the_keys_before_they_go(tmp_path, keyring, signer):
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1000)
    receipt = Eraser(keyring, audit, signer).erase_tenant("alice", now=2.0)
    audit.close()
    recs = [rec for _n, rec in read_records(log) if isinstance(rec, dict)]
    begun, done = recs[-2], recs[-1]
    assert (begun["kind"], done["kind"]) == ("erasure.begun", "erasure")
    assert begun["data"]["key_ids"] == list(receipt.key_ids)
    assert done["data"]["begun"] == begun["seq"] and done["seq"] == receipt.audit_seq
    assert unfinished_erasures(log) == []


@pytest.mark.parametrize("generation", [None, 1])
def test_a_read_only_key_directory_refuses_an_erasure_before_any_record(
        tmp_path, keyring, signer, generation):
    """Keys in a read-only mount (a Kubernetes Secret) cannot be destroyed: the erasure
    wrote ``erasure.begun`` and then failed with an OSError traceback, leaving an
    "unfinished erasure" in the log. It is refused first, the log and keys untouched."""
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1000)
    mounted = TenantKeyring(FileKeySource(tmp_path / "keys", writable=False))
    eraser = Eraser(mounted, audit, signer)
    with pytest.raises(KeyUnavailable, match="read-only .*nothing was changed"):
        if generation is None:
            eraser.erase_tenant("alice", now=2.0)
        else:
            eraser.erase_generation("alice", generation, now=2.0)
    audit.close()
    assert "erasure.begun" not in _kinds(log) and unfinished_erasures(log) == []
    assert keyring.has_keys("alice") and keyring.erasures() == {}


class _Killed(BaseException):
    """The erasing process dies here."""


def killed_erasure(monkeypatch, log, keyring, signer, at: tuple[object, str], erase) -> None:
    """``erase(Eraser)`` with ``at`` (owner, method) killing the process there: what it
    did until then stays, the log is closed, the patch undone."""
    def killed(*_args: object) -> None:
        raise _Killed

    monkeypatch.setattr(*at, killed)
    audit = AuditLog(log, signer, checkpoint_every=1000)
    with pytest.raises(_Killed):
        erase(Eraser(keyring, audit, signer))
    audit.close()
    monkeypatch.undo()


def test_a_generation_erasure_cut_off_before_its_marker_writes_it_when_finished(
        tmp_path, keyring, signer, monkeypatch):
    """Killed after the KEK went and before the generation's ``.gone`` marker: the rerun
    signed a receipt but never wrote the marker, so no running service ever enforced the
    erasure (they watch the markers) and pages sealed under it stayed served."""
    keyring.rotate("alice")
    log = tmp_path / "audit.log"
    killed_erasure(monkeypatch, log, keyring, signer, (TenantKeyring, "mark_generation_erased"),
                   lambda eraser: eraser.erase_generation("alice", 1, now=2.0))
    assert keyring.erased_generations() == [] and keyring.generations("alice") == [2]
    audit = AuditLog(log, signer, checkpoint_every=1000)
    rerun = TenantKeyring(FileKeySource(tmp_path / "keys"))  # a new process: no cached KEK
    receipt = Eraser(rerun, audit, signer).erase_generation("alice", 1, now=3.0)
    audit.close()
    assert receipt.generation == 1 and keyring.erased_generations() == [("alice", 1)]
    assert unfinished_erasures(log) == []


def test_a_tenant_erasure_cut_off_before_its_grant_went_revokes_it_when_finished(
        tmp_path, keyring, signer, monkeypatch):
    """Killed after the keys went and before the publish grant was revoked: the rerun
    finished the erasure from its ``erasure.begun`` record and left the grant file, which
    ``tenant publish`` listings still showed for the erased tenant."""
    grants = PublishGrants(keyring.source)
    grants.grant("alice", 1.0)
    log = tmp_path / "audit.log"
    killed_erasure(monkeypatch, log, keyring, signer, (PublishGrants, "revoke"),
                   lambda eraser: eraser.erase_tenant("alice", now=2.0))
    assert not keyring.has_keys("alice") and "alice" in grants.grants()
    audit = AuditLog(log, signer, checkpoint_every=1000)
    rerun = TenantKeyring(FileKeySource(tmp_path / "keys"))
    receipt = Eraser(rerun, audit, signer).erase_tenant("alice", now=3.0)
    audit.close()
    assert receipt.tenant == "alice" and unfinished_erasures(log) == []
    assert "alice" not in PublishGrants(rerun.source).grants()


def test_a_tenant_erasure_cut_off_part_way_names_every_key_when_finished(
        tmp_path, keyring, signer, monkeypatch):
    """Killed after it destroyed generation 1 and before generation 2 and the blinding
    secret: the rerun began afresh with what was left, and its receipt did not name
    generation 1 (which only the first ``erasure.begun`` named)."""
    keyring.rotate("alice")
    planned = keyring.tenant_key_ids("alice")
    source, destroyed = keyring.source, []
    real = type(source).destroy

    def destroy_once(self, name: str) -> bool:
        if destroyed:
            raise _Killed
        destroyed.append(name)
        return real(self, name)

    monkeypatch.setattr(type(source), "destroy", destroy_once)
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1000)
    with pytest.raises(_Killed):
        Eraser(keyring, audit, signer).erase_tenant("alice", now=2.0)
    audit.close()
    monkeypatch.undo()
    rerun = TenantKeyring(FileKeySource(tmp_path / "keys"))  # a new process
    assert len(rerun.tenant_key_ids("alice")) == len(planned) - 1
    audit = AuditLog(log, signer, checkpoint_every=1000)
    receipt = Eraser(rerun, audit, signer).erase_tenant("alice", now=3.0)
    audit.close()
    assert sorted(receipt.key_ids) == sorted(planned) and not rerun.has_keys("alice")
    assert unfinished_erasures(log) == []


def test_a_read_only_key_directory_behind_a_kms_wrapper_refuses_an_erasure_first(
        tmp_path, signer):
    """The same through ``WrappedKeySource`` (keys wrapped by a KMS, stored in a mounted
    Secret): the erasure asked only a ``FileKeySource`` whether it could write, so behind
    the wrapper it recorded ``erasure.begun`` before the destroy failed."""
    wrapper = LocalKeyWrapper(b"m" * 32)
    TenantKeyring(WrappedKeySource(FileKeySource(tmp_path / "keys"), wrapper)
                  ).create_tenant("alice")
    mounted = TenantKeyring(WrappedKeySource(FileKeySource(tmp_path / "keys", writable=False),
                                             wrapper))
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1000)
    with pytest.raises(KeyUnavailable, match="read-only .*nothing was changed"):
        Eraser(mounted, audit, signer).erase_tenant("alice", now=2.0)
    audit.close()
    assert "erasure.begun" not in _kinds(log) and unfinished_erasures(log) == []
    assert mounted.has_keys("alice") and mounted.erasures() == {}


def test_an_append_the_disk_refuses_leaves_the_log_as_it_was(disk, signer):
    log = disk / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1)
    audit.append("note", {"n": 0}, 1.0)
    before = log.read_bytes(), (disk / "audit.log.head").read_bytes()
    fill(disk)
    with pytest.raises(OSError):
        audit.append("note", {"n": 1, "pad": "x" * 3000}, 2.0)
    assert (log.read_bytes(), (disk / "audit.log.head").read_bytes()) == before
    (disk / "ballast").unlink()
    pos = audit.append("note", {"n": 2}, 3.0)  # the chain goes on from where it stood
    audit.close()
    report = verify_log(log, Verifier(signer.public_raw()), anchors=[pos])
    assert report.ok, report.problems
    assert _kinds(log) == ["note", "checkpoint", "note", "checkpoint"]


def test_a_key_the_disk_cannot_hold_leaves_no_short_file(disk):
    ring = TenantKeyring(FileKeySource(disk / "keys"))
    fill(disk)
    tried = []
    with pytest.raises(OSError):
        for i in range(64):  # a file or two may still fit in the folder's slack
            tried.append(f"t{i}")
            ring.create_tenant(tried[-1])
    made = {p.name: p.stat().st_size for p in (disk / "keys").iterdir()}
    assert all(size > 0 for size in made.values()), made  # no empty or short key file
    (disk / "ballast").unlink()
    for tenant in tried:  # each tenant is whole once the disk has room
        if not ring.generations(tenant):
            ring.create_tenant(tenant)
        assert ring.seal_key(tenant, ring.current_generation(tenant)) and ring.blind_secret(tenant)


def test_a_log_that_refuses_the_first_record_destroys_nothing(disk, signer):
    ring = TenantKeyring(FileKeySource(disk / "keys"))
    ring.create_tenant("alice")
    audit = AuditLog(disk / "audit.log", signer, checkpoint_every=1)
    fill(disk)
    with pytest.raises(OSError):
        Eraser(ring, audit, signer).erase_tenant("alice", now=5.0)
    assert ring.has_keys("alice") and ring.erased_at("alice") is None
    assert _kinds(disk / "audit.log") == []
    (disk / "ballast").unlink()
    receipt = Eraser(ring, audit, signer).erase_tenant("alice", now=6.0)
    assert receipt.tenant == "alice" and not ring.has_keys("alice")
    audit.close()


@pytest.mark.parametrize("generation", [None, 1])
def test_an_erasure_whose_end_the_log_refused_is_finished_by_running_it_again(
        disk, signer, generation):
    from security.sealing import TenantSealer

    ring = TenantKeyring(FileKeySource(disk / "keys"))
    ring.create_tenant("alice")
    ring.rotate("alice")
    sealer = TenantSealer(ring)
    sealed = bytes(sealer.seal("alice", DIGEST, 1, 1, 1, b"page"))
    log = disk / "audit.log"
    audit = AuditLog(log, signer, checkpoint_every=1)
    calls = []

    def deleter(scope):
        calls.append(scope)
        if len(calls) == 1:
            fill(disk)  # the disk fills while the pages are deleted
            return 4
        return 0  # the first attempt deleted them all

    def erase(eraser):
        if generation is None:
            return eraser.erase_tenant("alice", now=7.0 + len(calls))
        return eraser.erase_generation("alice", generation, now=7.0 + len(calls))

    eraser = Eraser(ring, audit, signer)
    eraser.register_tier("host", deleter)
    with pytest.raises(ErasureUnrecorded, match="run the same erasure again"):
        erase(eraser)
    with pytest.raises(InvalidSeal):  # the keys went all the same
        sealer.open("alice", DIGEST, 1, 1, 1, sealed)
    verifier = Verifier(signer.public_raw())
    assert verify_log(log, verifier).ok  # nothing torn: the end is not there at all
    [begun] = unfinished_erasures(log)
    assert (begun.tenant, begun.generation) == ("alice", generation)
    with pytest.raises(ErasureUnrecorded):  # still full: still unrecorded, nothing lost
        erase(eraser)

    (disk / "ballast").unlink()
    receipt = erase(eraser)
    assert len(calls) == 3  # the deleters ran again
    # the receipt counts what the unrecorded attempt deleted (this Eraser kept it)
    assert receipt.key_ids == begun.key_ids and receipt.counts == (("host", 4),)
    assert (receipt.scope, receipt.generation) == (
        "tenant" if generation is None else "generation", generation)
    assert verify_receipt(receipt.to_json(), verifier) == receipt
    audit.close()
    assert verify_log(log, verifier, anchors=[receipt.audit_position()]).ok
    assert unfinished_erasures(log) == []
    with pytest.raises(KeyUnavailable):  # finished: a third run has nothing to do
        erase(Eraser(ring, AuditLog(log, signer), signer))


def test_a_whole_tenant_erasure_ends_an_unfinished_one_of_its_generations(tmp_path, signer):
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("alice")
    log = tmp_path / "audit.log"
    audit = AuditLog(log, signer)
    audit.append("erasure.begun", {"tenant": "alice", "generation": 1, "scope": "generation",
                                   "key_ids": ["alice/g1/00"]}, 1.0)
    assert [b.generation for b in unfinished_erasures(log)] == [1]
    Eraser(ring, audit, signer).erase_tenant("alice", now=2.0)
    audit.close()
    assert unfinished_erasures(log) == []


def _count_reads(monkeypatch) -> list[str]:
    import security.erasure as erasure_mod

    reads: list[str] = []
    real = erasure_mod.unfinished_erasures

    def counted(path):
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(erasure_mod, "unfinished_erasures", counted)
    return reads


def test_erasing_a_tenant_never_created_does_not_read_the_log(tmp_path, signer, monkeypatch):
    """The log is read in full to find an unfinished erasure: every erasure of an unknown
    (or mistyped) tenant did so, twice on the service (namespaces, then the resume)."""
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    audit = AuditLog(tmp_path / "audit.log", signer)
    audit.append("erasure.begun", {"tenant": "alice", "generation": None, "scope": "tenant",
                                   "key_ids": ["alice/g1/00"]}, 1.0)
    reads = _count_reads(monkeypatch)
    eraser = Eraser(ring, audit, signer)
    with pytest.raises(KeyUnavailable, match="no keys"):
        eraser.directory_namespaces("bob")
    with pytest.raises(KeyUnavailable, match="no keys"):
        eraser.erase_tenant("bob", now=2.0)
    # alice's begun record is in the log, but she was never marked erased: no key of hers
    # can have gone, so there is nothing to resume (her keys would be erased afresh)
    with pytest.raises(KeyUnavailable):
        eraser.erase_tenant("alice", now=2.0)
    assert reads == []
    with pytest.raises(KeyUnavailable):  # a generation scope still reads it, once
        eraser.erase_generation("bob", 1, now=2.0)
    assert len(reads) == 1
    audit.close()


def test_a_resume_reads_the_log_once_and_again_after_it_changed(tmp_path, signer, monkeypatch):
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("alice")
    ring.mark_erased("alice", 1.0)
    key_ids = ring.destroy_tenant("alice")  # an erasure that stopped before its end
    audit = AuditLog(tmp_path / "audit.log", signer)
    audit.append("erasure.begun", {"tenant": "alice", "generation": None, "scope": "tenant",
                                   "key_ids": key_ids}, 1.0)
    reads = _count_reads(monkeypatch)
    eraser = Eraser(ring, audit, signer)
    assert eraser.directory_namespaces("alice") == []  # none was recorded by that erasure
    receipt = eraser.erase_tenant("alice", now=2.0)
    assert list(receipt.key_ids) == key_ids and len(reads) == 1  # one read served both
    with pytest.raises(KeyUnavailable):  # finished: the log changed, so it is read again
        eraser.erase_tenant("alice", now=3.0)
    assert len(reads) == 2
    audit.close()
