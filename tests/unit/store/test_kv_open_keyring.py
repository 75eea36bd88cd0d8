"""Opening a sealed NVMe directory with a keyring that did not write it: records that open
under no key of the keyring are retired only where the keyring records the erasure that
explains them; otherwise the open fails with ``ForeignKeyring`` and the directory keeps
every byte (it used to class them all dead and delete every value)."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import pytest

from security.memory_keys import memory_keyring
from store.kv import ForeignKeyring, ForeignTenant, KVStore, KVStoreConfig, Sealing
from store.types import Tier


def open_store(directory: Path, ring) -> KVStore:
    config = KVStoreConfig(name=f"akv-kv-keyring-{uuid.uuid4().hex[:10]}", slot_bytes=1 << 16,
                           host_slots=0, nvme_dir=str(directory))
    return KVStore(config, Sealing(keyring=ring, tenant="acme"))


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def write(directory: Path, ring) -> None:
    with open_store(directory, ring) as store:
        store.put(b"x", b"precious", Tier.NVME)
        store.put(b"y", bytes(range(256)) * 40, Tier.NVME)


def test_another_keyring_with_the_same_tenant_name_is_refused_and_changes_nothing(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    write(directory, ring)
    before = snapshot(directory)
    with pytest.raises(ForeignKeyring) as refused:
        open_store(directory, memory_keyring("acme"))
    assert isinstance(refused.value, ForeignTenant) and "2 sealed records" in str(refused.value)
    assert snapshot(directory) == before
    with open_store(directory, ring) as store:  # the keyring that wrote it reads it all
        assert store.get(b"x") == b"precious" and len(store.nvme) == 2


def test_a_tenant_erased_and_created_again_retires_its_records_only_once_recorded(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    write(directory, ring)
    before = snapshot(directory)
    ring.destroy_tenant("acme")
    ring.create_tenant("acme")  # new keys, and nothing in the keyring says the old ones died
    with pytest.raises(ForeignKeyring):
        open_store(directory, ring)
    assert snapshot(directory) == before
    ring.mark_erased("acme", time.time())  # what security.erasure.Eraser records
    with open_store(directory, ring) as store:
        assert len(store.nvme) == 0


def test_a_damaged_record_is_still_retired_not_taken_for_a_strangers(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    with open_store(directory, ring) as store:
        store.put(b"x", b"precious", Tier.NVME)
        store.put(b"y", bytes(range(256)) * 40, Tier.NVME)
        extent = store.nvme.extent(store._seal.slot_id(b"y"))
    with open(extent.path, "r+b") as f:  # its key id (preamble bytes 8..24) no longer reads
        f.seek(extent.payload_offset + 10)
        byte = f.read(1)[0]
        f.seek(extent.payload_offset + 10)
        f.write(bytes([byte ^ 0x40]))
    with open_store(directory, ring) as store:
        assert len(store.nvme) == 1 and store.get(b"x") == b"precious"
