"""What a keyring does around an erasure: the mark never predates it, a process that
cached the tenant's keys forgets them, and a tenant without keys leaves no mark."""

from __future__ import annotations

import pytest

from security.audit import AuditLog
from security.erasure import Eraser
from security.errors import KeyUnavailable
from security.keyring import FileKeySource, TenantKeyring


def test_the_mark_rounds_up_so_a_token_from_just_before_is_older(keyring) -> None:
    at = 1_700_000_000.1234  # 0.4 ms into a millisecond
    keyring.mark_erased("alice", at)
    issued = at - 0.0002  # a token issued 0.2 ms before the erasure
    assert issued <= keyring.erased_at("alice")
    assert keyring.erased_at("alice") - at < 0.001


def test_a_process_that_cached_the_keys_forgets_them(keyring, tmp_path) -> None:
    other = TenantKeyring(FileKeySource(tmp_path / "keys"))  # e.g. a pool actor
    epoch, _aead = other.seal_key("alice", 1)
    old_id = other.key_id("alice", 1)
    keyring.destroy_tenant("alice")  # the erasure happens in another process
    keyring.create_tenant("alice")  # and the name is used again
    assert other.key_id("alice", 1) == old_id  # still the cached, destroyed key
    other.forget("alice")
    assert other.key_id("alice", 1) != old_id
    other.open_key("bob", 1, epoch)  # other tenants' cache is untouched


def test_a_process_that_cached_a_generation_forgets_only_it(keyring, tmp_path) -> None:
    other = TenantKeyring(FileKeySource(tmp_path / "keys"))  # e.g. a pool actor
    keyring.rotate("alice")
    old_epoch, _ = other.seal_key("alice", 1)
    new_epoch, _ = other.seal_key("alice", 2)
    keyring.destroy_generation("alice", 1)  # `tenant erase --generation 1`, elsewhere
    assert keyring.erased_generations() == [("alice", 1)]
    other.open_key("alice", 1, old_epoch)  # still cached: the erasure did not reach it
    other.forget_generation("alice", 1)
    with pytest.raises(KeyUnavailable):
        other.open_key("alice", 1, old_epoch)
    other.open_key("alice", 2, new_epoch)  # the newer generation is untouched
    keyring.destroy_tenant("alice")
    assert keyring.erased_generations() == []  # a whole erasure takes the markers too


def test_tenants_lists_those_with_a_blinding_secret(keyring) -> None:
    assert keyring.tenants() == ["alice", "bob"]
    keyring.destroy_tenant("bob")
    assert keyring.tenants() == ["alice"] and not keyring.has_keys("bob")


def test_erasing_a_tenant_without_keys_leaves_no_mark(keyring, signer, tmp_path) -> None:
    audit = AuditLog(tmp_path / "audit.log", signer)
    try:
        with pytest.raises(KeyUnavailable):
            Eraser(keyring, audit, signer).erase_tenant("carol", 1.0)
        assert keyring.erased_at("carol") is None
        Eraser(keyring, audit, signer).erase_tenant("bob", 2.0)
        with pytest.raises(KeyUnavailable):  # erased twice: the second leaves nothing
            Eraser(keyring, audit, signer).erase_tenant("bob", 3.0)
        assert keyring.erased_at("bob") == 2.0
    finally:
        audit.close()


def test_an_erasure_mark_keeps_the_blinded_directory_namespace(keyring, signer,
                                                               tmp_path) -> None:
    """Derived from the blinding secret the erasure shreds: the mark is the only place it
    is kept, for a directory that comes back from an older snapshot."""
    from security.blinding import DirectoryBlinder

    first = DirectoryBlinder(keyring).namespace("alice")
    audit = AuditLog(tmp_path / "audit.log", signer)
    eraser = Eraser(keyring, audit, signer)
    eraser.erase_tenant("alice", 1_700_000_000.0)
    keyring.create_tenant("alice")  # the name used again: a new secret, a new namespace
    second = DirectoryBlinder(keyring).namespace("alice")
    eraser.erase_tenant("alice", 1_700_000_100.0)
    audit.close()
    assert first != second
    assert keyring.erased_directory_namespaces() == sorted([("alice", first), ("alice", second)])
    assert not keyring.has_keys("alice") and keyring.tenants() == ["bob"]


@pytest.mark.parametrize("bad", ["alice", "n" + "0" * 23, "N" + "0" * 24, "n" + "g" * 24])
def test_a_mark_refuses_a_directory_namespace_of_the_wrong_shape(keyring, bad) -> None:
    from security.errors import InvalidName

    with pytest.raises(InvalidName, match="invalid directory namespace"):
        keyring.mark_erased("alice", 1_700_000_000.0, bad)
    assert keyring.erased_at("alice") is None  # nothing recorded


@pytest.mark.parametrize("scope", ["tenant", "generation"])
def test_an_erasure_whose_receipt_the_log_would_refuse_destroys_nothing(keyring, signer,
                                                                        tmp_path, scope) -> None:
    """The record is written after the keys are gone; a log already refusing appends (here
    replaced under its writer) is found first, and the erasure leaves every key in place."""
    from security.errors import AuditLogError

    path = tmp_path / "audit.log"
    audit = AuditLog(path, signer)
    audit.append("admin", {"i": 1}, 1.0)
    path.rename(tmp_path / "moved.log")
    path.write_bytes(b"")
    eraser = Eraser(keyring, audit, signer)
    with pytest.raises(AuditLogError, match="no longer the file"):
        if scope == "tenant":
            eraser.erase_tenant("alice", 2.0)
        else:
            eraser.erase_generation("alice", 1, 2.0)
    assert keyring.has_keys("alice") and keyring.generations("alice") == [1]
    assert keyring.erased_at("alice") is None
