"""Replacing a value in a host-only keyed library store (store.kv) whose slots are all
taken: ``put`` writes into the key's own slot; a write that fails there leaves the key
missing (``ReplaceFailed``), never half a value, in this process or in a reader's."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from security.memory_keys import memory_keyring
from store.host_pool import HostPool, SlotEmpty
from store.kv import KeyMissing, KVStore, KVStoreConfig, NoRoom, ReplaceFailed, Sealing
from store.types import Tier

SLOT = 64 << 10


@pytest.fixture(params=["plain", "sealed"])
def mode(request) -> str:
    return request.param


def full_store(mode: str, ring=None) -> KVStore:
    sealing = None
    if mode == "sealed":
        sealing = Sealing(keyring=ring or memory_keyring("acme"), tenant="acme")
    store = KVStore(KVStoreConfig(name=f"akv-kv-repl-{uuid.uuid4().hex[:10]}", slot_bytes=SLOT,
                                  host_slots=2), sealing)
    store.put(b"a", b"old a")
    store.put(b"b", b"old b")
    return store


def test_a_put_over_a_key_in_a_full_pool_replaces_it_in_its_own_slot(mode):
    with full_store(mode) as store:
        slot = store._host_index[b"a"].slot
        for n in (1, SLOT, 10):  # used to be NoRoom: no free slot
            value = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
            assert store.put(b"a", value) is Tier.HOST
            assert store.get(b"a") == value and store._host_index[b"a"].slot == slot
        assert store.put(b"a", b"") is Tier.HOST and store.get(b"a") == b""
        assert store.get(b"b") == b"old b" and store.host.stats().used_slots == 2 - (
            mode == "plain")  # an empty unsealed value holds no slot


def test_what_a_full_pool_still_refuses_says_why_and_keeps_the_old_value(mode):
    with full_store(mode) as store:
        with pytest.raises(NoRoom, match="all 2 host slots are taken"):
            store.put(b"c", b"new key")
        with pytest.raises(NoRoom, match="put.. replaces in place, or delete the key first"):
            store.reserve(b"a", 3)  # its old value must stay readable until commit
        with pytest.raises(NoRoom, match="no NVMe tier"):
            store.put(b"a", b"x", Tier.NVME)
        assert store.get(b"a") == b"old a" and store.get(b"b") == b"old b"
        store.delete(b"a")
        with store.reserve(b"a", 3) as r:  # with the key deleted first, it fits
            r.buffer[:] = 1
        assert store.get(b"a") == bytes([1]) * 3


def test_a_failed_replace_leaves_the_key_missing_and_its_slot_free(tmp_path):
    ring = memory_keyring("acme")
    with full_store("sealed", ring) as store:
        ring.destroy_tenant("acme")  # sealing the new value fails
        with pytest.raises(ReplaceFailed) as failed:
            store.put(b"a", b"new a")
        assert failed.value.__cause__ is not None
        with pytest.raises(KeyMissing):
            store.get(b"a")
        assert not store.contains(b"a") and store.host.stats().used_slots == 1


def test_a_replace_that_fails_mid_write_is_never_read_as_a_value(monkeypatch):
    with full_store("plain") as store:
        slot = store._host_index[b"a"].slot
        reader = HostPool.attach(store.host.name)

        def torn(*_args: object) -> int:
            with pytest.raises(KeyMissing):  # mid-write, the key is already gone here...
                store.get(b"a")
            raise OSError("device went away")

        monkeypatch.setattr(store.host, "commit", torn)  # fault injected on this pool only
        try:
            with pytest.raises(ReplaceFailed, match="old value is gone"):
                store.put(b"a", b"N" * 5000)
            with pytest.raises(SlotEmpty):  # ...and for a reader of the segment
                reader.read(slot)
        finally:
            reader.close()
        assert not store.contains(b"a") and store.get(b"b") == b"old b"
        monkeypatch.undo()
        assert store.put(b"c", b"the freed slot") is Tier.HOST
        assert store.get(b"c") == b"the freed slot"
