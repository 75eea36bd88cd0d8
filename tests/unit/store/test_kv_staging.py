"""The plaintext staging buffer of a sealed store's reservations is zeroed once the value
is sealed or given up: it used to hand the previous value's plaintext to the next
reservation, for any key, and keep it in memory for as long as the store ran."""

from __future__ import annotations

import gc
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.memory_keys import memory_keyring
from store.kv import KVStore, KVStoreConfig, Sealing
from store.types import Tier

SECRET = np.frombuffer(b"PASSWORD=hunter2", np.uint8)


def open_store(tmp_path: Path) -> KVStore:
    config = KVStoreConfig(name=f"akv-kv-staging-{uuid.uuid4().hex[:10]}", slot_bytes=8192,
                           host_slots=2, nvme_dir=str(tmp_path / "nv"))
    return KVStore(config, Sealing(keyring=memory_keyring("acme"), tenant="acme"))


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
@pytest.mark.parametrize("finish", ["commit", "abort", "dropped"])
def test_a_reservation_never_starts_with_another_ones_plaintext(tmp_path, tier, finish):
    with open_store(tmp_path) as store:
        r = store.reserve(b"secret", SECRET.size, tier)
        r.buffer[:] = SECRET
        staging = r.buffer
        if finish == "dropped":
            del r
            gc.collect()
            store.contains(b"x")  # the store takes a dropped one's buffer back at a call
        else:
            getattr(store, finish)(r)
        assert not staging.any()  # nothing of it stays in the store's memory
        nxt = store.reserve(b"other", SECRET.size, tier)
        assert not nxt.buffer.any()
        store.abort(nxt)
        if finish == "commit":
            assert store.get(b"secret") == SECRET.tobytes()
