"""One contract for every KeySource (plain files, wrapped/KMS-style), and the sealer over each."""

from __future__ import annotations

import os

import pytest

from security.errors import InvalidName, InvalidSeal, KeyExists, KeyUnavailable
from security.keyring import FileKeySource, LocalKeyWrapper, TenantKeyring, WrappedKeySource
from security.sealing import TenantSealer

KEY = bytes(range(32))


@pytest.fixture(params=["file", "wrapped"])
def source(request, tmp_path):
    files = FileKeySource(tmp_path / "keys")
    if request.param == "file":
        return files
    return WrappedKeySource(files, LocalKeyWrapper(os.urandom(32)))


def test_create_read_destroy(source):
    assert source.names() == []
    source.create("acme.g00000001.kek", KEY)
    assert source.read("acme.g00000001.kek") == KEY
    assert source.names() == ["acme.g00000001.kek"]
    with pytest.raises(KeyExists):
        source.create("acme.g00000001.kek", os.urandom(32))
    assert source.read("acme.g00000001.kek") == KEY  # never overwritten
    assert source.destroy("acme.g00000001.kek") is True
    assert source.destroy("acme.g00000001.kek") is False
    with pytest.raises(KeyUnavailable):
        source.read("acme.g00000001.kek")
    assert source.names() == []


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b", "", ".hidden", "UPPER", "x" * 200])
def test_names_are_validated(source, name):
    with pytest.raises(InvalidName):
        source.create(name, KEY)
    with pytest.raises(InvalidName):
        source.read(name)


def test_sealer_round_trip_and_shredding(source):
    ring = TenantKeyring(source)
    ring.create_tenant("acme")
    sealer = TenantSealer(ring)
    digest = b"i" * 32
    sealed = bytes(sealer.seal("acme", digest, 1, 2, 3, b"kv page"))
    assert bytes(TenantSealer(TenantKeyring(source)).open("acme", digest, 1, 2, 3, sealed)) == b"kv page"
    ring.destroy_tenant("acme")
    for reader in (sealer, TenantSealer(TenantKeyring(source))):
        with pytest.raises(InvalidSeal):
            reader.open("acme", digest, 1, 2, 3, sealed)
