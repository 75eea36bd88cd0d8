"""A sealed store whose tenant is erased while it runs, or whose host value's key
generation is: every call answers as for a missing key (it used to raise the keyring's
``KeyUnavailable`` on the NVMe side and keep the records), and ``contains`` agrees with
``get`` before any ``get`` has tried the value."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from security.memory_keys import memory_keyring
from store.kv import KeyMissing, KVStore, KVStoreConfig, Sealing
from store.types import Tier


def open_store(tmp_path: Path, ring, *, nvme: bool = True) -> KVStore:
    config = KVStoreConfig(name=f"akv-kv-erased-{uuid.uuid4().hex[:10]}", slot_bytes=8192,
                           host_slots=2, nvme_dir=str(tmp_path / "nv") if nvme else None)
    return KVStore(config, Sealing(keyring=ring, tenant="acme"))


def test_after_the_tenant_is_erased_nvme_keys_are_missing_and_its_records_go(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, ring) as store:
        store.put(b"h", b"on the host", Tier.HOST)
        store.put(b"n", b"on nvme", Tier.NVME)
        store.put(b"m", b"on nvme too", Tier.NVME)
        ring.destroy_tenant("acme")
        assert not store.contains(b"n")
        assert len(store.nvme) == 0  # no record of the tenant opens again: all retired
        for key in (b"n", b"m", b"never-stored"):
            with pytest.raises(KeyMissing):
                store.get(key)
            assert not store.contains(key) and not store.drop_cache(key)
            assert store.delete(key) is False
        with pytest.raises(KeyMissing):
            store.get(b"h")


def test_contains_is_false_for_a_host_value_sealed_under_an_erased_generation(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, ring, nvme=False) as store:
        store.put(b"old", b"under generation 1")
        ring.rotate("acme")
        store.put(b"new", b"under generation 2")
        ring.destroy_generation("acme", 1)
        assert not store.contains(b"old")  # asked before any get tried it
        assert store.host.stats().used_slots == 1  # and its slot is free, as get frees it
        with pytest.raises(KeyMissing):
            store.get(b"old")
        assert store.contains(b"new") and store.get(b"new") == b"under generation 2"
