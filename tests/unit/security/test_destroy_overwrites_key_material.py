"""Crypto-shredding overwrites a key file in place before
it unlinks it (docs/security.md, Erasure): another name for the same inode (a hard link a
backup or snapshot tool made, a file descriptor opened before the erasure) reads zeros
afterwards, never the KEK or the blinding secret. An unlink alone left them readable."""

from __future__ import annotations

import os

from security.keyring import FileKeySource, TenantKeyring, blind_name, kek_name


def test_an_erased_tenants_key_files_are_zeroed_before_they_go(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("acme")
    ring.rotate("acme")  # two generations
    names = [kek_name("acme", 1), kek_name("acme", 2), blind_name("acme")]
    backup = tmp_path / "backup"
    backup.mkdir()
    held = {}
    for name in names:
        os.link(keys / name, backup / name)  # e.g. a backup tool's hard link
        held[name] = (keys / name).read_bytes()
        assert held[name].strip(b"\0")  # control: real key material
    ring.destroy_tenant("acme")
    for name in names:
        assert not (keys / name).exists()
        left = (backup / name).read_bytes()
        assert left == bytes(len(held[name])), f"{name} still holds its key material"


def test_an_erased_generations_kek_is_zeroed_before_it_goes(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("acme")
    fd = os.open(keys / kek_name("acme", 1), os.O_RDONLY)  # opened before the erasure
    try:
        ring.destroy_generation("acme", 1)
        assert os.pread(fd, 64, 0) == bytes(len(os.pread(fd, 64, 0)))
        assert os.fstat(fd).st_size > 0 and not os.pread(fd, 64, 0).strip(b"\0")
    finally:
        os.close(fd)
