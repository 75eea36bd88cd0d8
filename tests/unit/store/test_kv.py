"""The keyed library store (store.kv) over a real /dev/shm host pool and a real NVMe shard,
unsealed and sealed with an in-memory keyring: one contract for all four."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.memory_keys import MemoryKeySource, memory_keyring
from store.host_pool import SHM_DIR
from store.kv import KeyMissing, KVStore, KVStoreConfig, NoRoom, Sealing, ValueTooLarge
from store.types import Tier

SLOT = 3 << 20


@pytest.fixture(params=["plain", "sealed"])
def mode(request) -> str:
    return request.param


def open_store(tmp_path: Path, mode: str, *, host_slots: int = 2, nvme: bool = True,
               keyring=None) -> KVStore:
    sealing = None
    if mode == "sealed":
        sealing = Sealing(keyring=keyring or memory_keyring("acme"), tenant="acme")
    config = KVStoreConfig(name=f"akv-kv-test-{uuid.uuid4().hex[:10]}", slot_bytes=SLOT,
                           host_slots=host_slots,
                           nvme_dir=str(tmp_path / "nv") if nvme else None)
    return KVStore(config, sealing)


def value(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
def test_put_get_contains_delete(tmp_path, mode, tier):
    with open_store(tmp_path, mode, host_slots=4) as store:
        for i, n in enumerate((0, 1, 5000, SLOT)):
            key = b"key-%d" % i
            assert store.put(key, value(n, i), tier) is tier
            assert store.contains(key)
            assert store.get(key) == value(n, i)
            out = np.zeros(SLOT + 10, np.uint8)
            view = store.get(key, out=out)
            assert bytes(view) == value(n, i) and np.shares_memory(np.asarray(view), out) or n == 0
        store.put(b"key-2", value(100, 9), tier)  # replaced
        assert store.get(b"key-2") == value(100, 9)
        assert store.delete(b"key-2") and not store.contains(b"key-2")
        assert not store.delete(b"key-2")
        with pytest.raises(KeyMissing):
            store.get(b"key-2")
        if store.host is not None:
            held = 3 if tier is Tier.HOST and mode == "sealed" else 2 if tier is Tier.HOST else 0
            assert store.host.stats().used_slots == held  # no slot leaked by replace/delete


def test_bad_input_is_a_clear_error_and_loses_nothing(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        store.put(b"a", b"kept")
        with pytest.raises(ValueTooLarge):
            store.put(b"a", bytes(SLOT + 1))
        with pytest.raises(ValueError):
            store.put(b"", b"x")  # keys are 1..255 bytes
        with pytest.raises(ValueError):
            store.put(b"k" * 256, b"x")
        assert store.get(b"a") == b"kept"


def test_a_full_host_pool_spills_to_nvme_and_without_nvme_says_so(tmp_path, mode):
    with open_store(tmp_path, mode, host_slots=1) as store:
        assert store.put(b"a", value(1000, 1)) is Tier.HOST
        assert store.put(b"b", value(1000, 2)) is Tier.NVME
        assert store.get(b"a") == value(1000, 1) and store.get(b"b") == value(1000, 2)
    with open_store(tmp_path / "x", mode, host_slots=1, nvme=False) as store:
        store.put(b"a", b"1")
        with pytest.raises(NoRoom):
            store.put(b"b", b"2")


def test_reserve_commit_writes_in_place_and_abort_leaves_nothing(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        r = store.reserve(b"page", 4096)
        if mode == "plain":  # the producer writes into the pool slot itself
            assert np.shares_memory(r.buffer, store.host.buffer)
        r.buffer[:] = 7
        assert store.commit(r) is Tier.HOST
        assert store.get(b"page") == bytes([7]) * 4096
        r = store.reserve(b"other", 100)
        r.buffer[:] = 1
        store.abort(r)
        assert not store.contains(b"other")
        assert store.host.stats().used_slots == 1
        r = store.reserve(b"n", 10, Tier.NVME)
        r.buffer[:] = 3
        assert store.commit(r) is Tier.NVME and store.get(b"n") == bytes([3]) * 10


def test_sealed_store_keeps_no_plaintext_and_no_key_in_shm_or_files(tmp_path):
    secret_key = b"tenant-acme/session-42/page-7"
    page = b"TOOL:web_search result=" * 40_000
    with open_store(tmp_path, "sealed", host_slots=1) as store:
        assert store.put(secret_key, page) is Tier.HOST
        assert store.put(secret_key + b"-nv", page) is Tier.NVME
        blobs = [(Path(SHM_DIR) / store.host.name).read_bytes()]
        blobs += [p.read_bytes() for p in (tmp_path / "nv").rglob("*.akv")]
        for blob in blobs:
            assert b"web_search" not in blob and b"acme" not in blob and b"page-7" not in blob
            assert len(page).to_bytes(8, "big") not in blob
        assert store.get(secret_key) == page and store.get(secret_key + b"-nv") == page


def test_sealed_nvme_values_outlive_the_process_and_die_with_the_keys(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        store.put(b"k", value(70_000, 3), Tier.NVME)
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        assert store.contains(b"k") and store.get(b"k") == value(70_000, 3)
        ring.destroy_tenant("acme")
        ring.create_tenant("acme")  # the same name again: new keys
        with pytest.raises(KeyMissing):
            store.get(b"k")


def test_a_host_value_sealed_under_an_erased_generation_goes_as_on_nvme(tmp_path):
    """It never opens again: it used to stay listed (``contains`` true after ``get`` said
    missing) and keep its host slot for as long as the store ran."""
    ring = memory_keyring("acme")
    with open_store(tmp_path, "sealed", keyring=ring) as store:
        store.put(b"h", value(1000, 1), Tier.HOST)
        store.put(b"n", value(1000, 2), Tier.NVME)
        ring.rotate("acme")
        ring.destroy_generation("acme", 1)
        for key in (b"h", b"n"):
            with pytest.raises(KeyMissing):
                store.get(key)
            assert not store.contains(key)
        assert store.host.stats().used_slots == 0


def test_tampered_sealed_values_are_misses_not_garbage(tmp_path):
    with open_store(tmp_path, "sealed") as store:
        store.put(b"h", value(1 << 20, 4))
        slot = store._host_index[b"h"].slot
        at = store.host.slot_offset(slot) + 4096
        store.host.buffer[at] ^= 1
        with pytest.raises(KeyMissing):
            store.get(b"h")
        store.put(b"n", value(1 << 20, 5), Tier.NVME)
        extent = store.nvme.extent(store._seal.slot_id(b"n"))
        fd = os.open(extent.path, os.O_RDWR)
        try:
            os.pwrite(fd, b"\xff", extent.payload_offset + 2000)
        finally:
            os.close(fd)
        store.nvme.drop_cache(store._seal.slot_id(b"n"))
        with pytest.raises(KeyMissing):
            store.get(b"n")


def test_memory_key_source_contract():
    source = MemoryKeySource()
    source.create("a.key", b"k" * 32)
    assert source.read("a.key") == b"k" * 32 and source.names() == ["a.key"]
    with pytest.raises(Exception, match="already exists"):
        source.create("a.key", b"x" * 32)
    assert source.destroy("a.key") and not source.destroy("a.key")
    with pytest.raises(Exception, match="does not exist"):
        source.read("a.key")


def test_restart_drops_nvme_records_sealed_under_an_erased_generation(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        store.put(b"old", value(70_000, 1), Tier.NVME)
        store.put(b"old-2", value(5_000, 2), Tier.NVME)
        ring.rotate("acme")
        store.put(b"new", value(70_000, 3), Tier.NVME)
        assert len(store.nvme) == 3
    ring.destroy_generation("acme", 1)
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        assert len(store.nvme) == 1  # only the record under the live generation is indexed
        assert not store.contains(b"old") and not store.contains(b"old-2")
        assert store.get(b"new") == value(70_000, 3)
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        assert len(store.nvme) == 1  # retired for good: tombstones outlive the restart


def test_restart_drops_every_nvme_record_of_a_tenant_erased_and_created_again(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        store.put(b"a", value(70_000, 1), Tier.NVME)
        store.put(b"b", value(9_000, 2), Tier.NVME)
    ring.mark_erased("acme", time.time())  # as security.erasure.Eraser records it
    ring.destroy_tenant("acme")
    ring.create_tenant("acme")  # the same name again: new keys, nothing old opens
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        assert len(store.nvme) == 0 and store.nvme.stats().live_bytes == 0


def test_a_sealed_nvme_record_that_fails_to_open_leaves_the_index(tmp_path):
    ring = memory_keyring("acme")
    with open_store(tmp_path, "sealed", host_slots=0, keyring=ring) as store:
        store.put(b"k", value(70_000, 1), Tier.NVME)
        ring.rotate("acme")
        ring.destroy_generation("acme", 1)  # erased while the store runs
        assert store.contains(b"k")  # still indexed: nothing tried to open it yet
        with pytest.raises(KeyMissing):
            store.get(b"k")
        assert not store.contains(b"k") and len(store.nvme) == 0
