"""An erasure killed while a key file is half destroyed: ``FileKeySource.destroy`` zeroes
the file and fsyncs it before it unlinks it, and a kill between the two left 32 zero bytes
that read as a key. The rerun then named a key id derived from the zeroed KEK, or derived
a directory namespace from a zeroed blinding secret (deleting nothing there, and marking
it erased)."""

from __future__ import annotations

import base64
import os

import pytest

from security.audit import AuditLog
from security.blinding import DirectoryBlinder
from security.erasure import Eraser, unfinished_erasures
from security.keyring import (
    FileKeySource,
    KeyDestroyed,
    LocalKeyWrapper,
    TenantKeyring,
    WrappedKeySource,
)


class _Killed(BaseException):
    """The erasing process dies here."""


def _zero_then_die(monkeypatch, suffix: str) -> None:
    """The first destroy of a key named ``*suffix`` zeroes it, fsyncs and dies."""

    def destroy(self, name: str) -> bool:
        if name.endswith(suffix):
            fd = os.open(self.directory / name, os.O_WRONLY)
            os.write(fd, b"\0" * os.fstat(fd).st_size)
            os.fsync(fd)
            os.close(fd)
            raise _Killed
        return real(self, name)

    real = FileKeySource.destroy
    monkeypatch.setattr(FileKeySource, "destroy", destroy)


def _killed_erasure(tmp_path, keyring, signer, monkeypatch, suffix, generation=None):
    log = tmp_path / "audit.log"
    _zero_then_die(monkeypatch, suffix)
    audit = AuditLog(log, signer, checkpoint_every=1000)
    eraser = Eraser(keyring, audit, signer)
    with pytest.raises(_Killed):
        if generation is None:
            eraser.erase_tenant("alice", now=2.0)
        else:
            eraser.erase_generation("alice", generation, now=2.0)
    audit.close()
    monkeypatch.undo()
    [begun] = unfinished_erasures(log)
    # a new process: nothing cached
    return log, begun, TenantKeyring(FileKeySource(tmp_path / "keys"))


def _files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "keys").iterdir() if p.name.startswith("alice."))


@pytest.mark.parametrize("content", [b"\0" * 32, b"\0" * 44, b"\0" * 60],
                         ids=["raw", "base64", "wrapped"])
def test_a_zeroed_key_file_reads_as_destroyed(tmp_path, content):
    """Raw, base64 (a Secret made from text) and KMS-wrapped keys alike."""
    source = FileKeySource(tmp_path)
    (tmp_path / "alice.blind.key").write_bytes(content)
    with pytest.raises(KeyDestroyed, match="zeroed by a destroy"):
        source.read("alice.blind.key")
    with pytest.raises(KeyDestroyed):
        WrappedKeySource(source, LocalKeyWrapper(b"m" * 32)).read("alice.blind.key")
    (tmp_path / "bob.blind.key").write_bytes(base64.b64encode(b"\0" * 32))
    assert source.read("bob.blind.key") == b"\0" * 32  # text, not a zeroed file: as it was


def test_a_rerun_after_a_kill_mid_kek_destroy_names_the_real_key_ids(
        tmp_path, keyring, signer, monkeypatch):
    log, begun, rerun = _killed_erasure(tmp_path, keyring, signer, monkeypatch, ".kek")
    assert rerun.tenant_key_ids("alice") == ["alice/blind"]  # the zeroed KEK is no key
    audit = AuditLog(log, signer, checkpoint_every=1000)
    receipt = Eraser(rerun, audit, signer).erase_tenant("alice", now=3.0)
    audit.close()
    assert receipt.key_ids == begun.key_ids and unfinished_erasures(log) == []
    assert [n for n in _files(tmp_path) if "kek" in n or "blind" in n] == []


def test_a_rerun_after_a_kill_mid_blind_destroy_finds_the_marked_namespace(
        tmp_path, keyring, signer, monkeypatch):
    namespace = DirectoryBlinder(keyring).namespace("alice")
    log, begun, rerun = _killed_erasure(tmp_path, keyring, signer, monkeypatch, ".blind.key")
    audit = AuditLog(log, signer, checkpoint_every=1000)
    eraser = Eraser(rerun, audit, signer)
    assert eraser.directory_namespaces("alice") == [namespace]
    receipt = eraser.erase_tenant("alice", now=3.0)
    audit.close()
    assert receipt.key_ids == begun.key_ids and unfinished_erasures(log) == []
    assert rerun.erased_directory_namespaces() == [("alice", namespace)]  # no second mark
    assert not [n for n in _files(tmp_path) if "blind" in n]


def test_a_rerun_after_a_kill_mid_generation_destroy_finishes_it(
        tmp_path, keyring, signer, monkeypatch):
    log, begun, rerun = _killed_erasure(tmp_path, keyring, signer, monkeypatch, ".kek",
                                        generation=1)
    audit = AuditLog(log, signer, checkpoint_every=1000)
    receipt = Eraser(rerun, audit, signer).erase_generation("alice", 1, now=3.0)
    audit.close()
    assert receipt.key_ids == begun.key_ids and unfinished_erasures(log) == []
    assert "alice.g00000001.kek" not in _files(tmp_path) and rerun.generations("alice") == []
    assert ("alice", 1) in rerun.erased_generations()
