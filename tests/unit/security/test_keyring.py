"""Key sources and the keyring: files, Secret-style volumes, wrapped (KMS-style) keys, budgets."""

from __future__ import annotations

import base64
import os

import pytest

from security.errors import InvalidName, KeyExists, KeyUnavailable
from security.keyring import (
    NIST_RANDOM_NONCE_LIMIT,
    FileKeySource,
    KeyringConfig,
    LocalKeyWrapper,
    TenantKeyring,
    WrappedKeySource,
)
from security.sealing import TenantSealer

DIGEST = b"d" * 32


def test_default_nonce_limit_is_the_nist_random_nonce_bound(tmp_path):
    assert NIST_RANDOM_NONCE_LIMIT == 2**32
    assert TenantKeyring(FileKeySource(tmp_path)).config.nonce_limit == 2**32
    with pytest.raises(ValueError, match="800-38D"):
        TenantKeyring(FileKeySource(tmp_path), KeyringConfig(nonce_limit=2**32 + 1))


def test_files_are_private_and_flat(tmp_path):
    ring = TenantKeyring(FileKeySource(tmp_path / "k"))
    assert ring.create_tenant("acme") == 1
    assert sorted(os.listdir(tmp_path / "k")) == ["acme.blind.key", "acme.g00000001.kek"]
    for name in os.listdir(tmp_path / "k"):
        assert os.stat(tmp_path / "k" / name).st_mode & 0o777 == 0o600
        assert len((tmp_path / "k" / name).read_bytes()) == 32
    with pytest.raises(KeyExists):
        ring.create_tenant("acme")


def test_a_creation_cut_short_is_completed_by_the_next_one(tmp_path):
    """A blinding secret and no generation (the disk filled, or the process died, between
    the two files): the next creation completes the tenant instead of refusing it."""
    ring = TenantKeyring(FileKeySource(tmp_path / "k"))
    ring.source.create("acme.blind.key", b"b" * 32)
    assert ring.create_tenant("acme") == 1
    assert ring.generations("acme") == [1] and ring.blind_secret("acme")


def test_a_tenant_whose_generations_were_erased_starts_above_them(tmp_path):
    ring = TenantKeyring(FileKeySource(tmp_path / "k"))
    ring.create_tenant("acme")
    ring.rotate("acme")
    ring.destroy_generation("acme", 1)
    ring.destroy_generation("acme", 2)
    assert ring.create_tenant("acme") == 3  # never a number an erasure receipt named


def test_kubernetes_secret_volume_layout_is_readable(tmp_path):
    """A Secret volume: files are symlinks into a ..data dir, content may be base64 text."""
    data = tmp_path / "secret" / "..2026_11_29"
    data.mkdir(parents=True)
    kek, blind = os.urandom(32), os.urandom(32)
    (data / "acme.g00000003.kek").write_bytes(base64.b64encode(kek) + b"\n")
    (data / "acme.blind.key").write_bytes(blind)
    os.symlink(data.name, tmp_path / "secret" / "..data")
    for name in ("acme.g00000003.kek", "acme.blind.key"):
        os.symlink(f"..data/{name}", tmp_path / "secret" / name)
    source = FileKeySource(tmp_path / "secret", writable=False)
    ring = TenantKeyring(source)
    assert ring.generations("acme") == [3] and ring.blind_secret("acme") == blind
    assert source.read("acme.g00000003.kek") == kek
    sealer = TenantSealer(ring)
    assert bytes(sealer.open("acme", DIGEST, 3, 1, 1, sealer.seal("acme", DIGEST, 3, 1, 1, b"hi"))) == b"hi"
    with pytest.raises(KeyUnavailable, match="read-only"):
        ring.rotate("acme")


def test_malformed_key_file_is_a_clean_error(tmp_path):
    (tmp_path / "acme.g00000001.kek").write_bytes(b"short")
    with pytest.raises(KeyUnavailable, match="not 32 raw bytes"):
        FileKeySource(tmp_path).read("acme.g00000001.kek")


def test_wrapped_source_stores_no_plain_key(tmp_path):
    master = os.urandom(32)
    inner = FileKeySource(tmp_path)
    ring = TenantKeyring(WrappedKeySource(inner, LocalKeyWrapper(master)))
    ring.create_tenant("acme")
    sealer = TenantSealer(ring)
    sealed = sealer.seal("acme", DIGEST, 1, 1, 1, b"page")
    stored = inner.read_blob("acme.g00000001.kek")
    assert len(stored) == 12 + 32 + 16
    other = TenantKeyring(WrappedKeySource(inner, LocalKeyWrapper(os.urandom(32))))
    with pytest.raises(KeyUnavailable, match="does not unwrap"):
        other.blind_secret("acme")
    again = TenantSealer(TenantKeyring(WrappedKeySource(inner, LocalKeyWrapper(master))))
    assert bytes(again.open("acme", DIGEST, 1, 1, 1, sealed)) == b"page"


def test_rotation_and_generations(keyring):
    assert keyring.current_generation("alice") == 1
    assert keyring.rotate("alice") == 2 and keyring.rotate("alice") == 3
    assert keyring.generations("alice") == [1, 2, 3]
    assert keyring.generations("bob") == [1]
    with pytest.raises(KeyUnavailable):
        keyring.current_generation("carol")


def test_key_ids_name_keys_without_revealing_them(keyring):
    key_id = keyring.key_id("alice", 1)
    kek = keyring.source.read("alice.g00000001.kek")
    assert key_id.startswith("alice/g1/") and len(key_id.split("/")[2]) == 16
    assert kek.hex()[:16] not in key_id
    assert key_id != keyring.key_id("bob", 1)


def test_destroy_tenant_removes_every_key(keyring):
    keyring.rotate("alice")
    ids = keyring.destroy_tenant("alice")
    assert [i.split("/")[:2] for i in ids] == [["alice", "g1"], ["alice", "g2"], ["alice", "blind"]]
    assert keyring.generations("alice") == [] and keyring.source.names() == [
        "bob.blind.key", "bob.g00000001.kek"]
    with pytest.raises(KeyUnavailable):
        keyring.destroy_tenant("alice")


def test_erasure_mark_outlives_the_keys_and_a_new_provisioning(keyring):
    assert keyring.erased_at("alice") is None
    keyring.mark_erased("alice", 1000.25)
    keyring.mark_erased("alice", 1000.25)  # the same instant twice: recorded once
    keyring.destroy_tenant("alice")
    assert keyring.erased_at("alice") == 1000.25
    keyring.create_tenant("alice")  # provisioned again: the mark stays
    keyring.mark_erased("alice", 2000.5)
    assert keyring.erased_at("alice") == 2000.5  # the latest erasure counts
    assert keyring.erased_at("bob") is None and keyring.generations("alice") == [1]
    with pytest.raises(InvalidName):
        keyring.erased_at("Alice")


@pytest.mark.parametrize("name", ["", "A", "-x", "a" * 64, "a/b", "a.b", "..", 7, None, "public!"])
def test_invalid_tenant_names(keyring, name):
    with pytest.raises(InvalidName):
        keyring.create_tenant(name)


def test_generation_numbers_are_never_reused(keyring, sealer):
    assert keyring.rotate("alice") == 2
    old = bytes(sealer.seal("alice", DIGEST, 2, 1, 1, b"gen two"))
    keyring.destroy_generation("alice", 2)
    assert keyring.generations("alice") == [1] and keyring.current_generation("alice") == 1
    assert keyring.rotate("alice") == 3  # not 2 again
    with pytest.raises(KeyUnavailable):
        keyring.key_id("alice", 2)
    with pytest.raises(Exception, match="does not open"):
        sealer.open("alice", DIGEST, 2, 1, 1, old)
    keyring.destroy_tenant("alice")
    assert [n for n in keyring.source.names() if n.startswith("alice")] == []
