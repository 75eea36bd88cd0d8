"""Reservations of the keyed library store (store.kv) finished by a ``with`` block, or never:
a producer that fails between reserve and commit, or drops the reservation, does not keep a
slot, and giving a dropped reservation's slot back never frees a slot another key uses."""

from __future__ import annotations

import gc
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.memory_keys import memory_keyring
from store.kv import KVStore, KVStoreConfig, NoRoom, ReservationClosed, Sealing
from store.types import Tier

SLOT = 1 << 20


@pytest.fixture(params=["plain", "sealed"])
def mode(request) -> str:
    return request.param


def open_store(tmp_path: Path, mode: str, *, host_slots: int = 1, nvme: bool = False
               ) -> KVStore:
    sealing = Sealing(keyring=memory_keyring("acme"), tenant="acme") if mode == "sealed" else None
    config = KVStoreConfig(name=f"akv-kv-res-{uuid.uuid4().hex[:10]}", slot_bytes=SLOT,
                           host_slots=host_slots, nvme_dir=str(tmp_path / "nv") if nvme else None)
    return KVStore(config, sealing)


class ProducerFailed(Exception):
    pass


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
def test_a_with_block_commits_on_exit_and_aborts_on_an_error(tmp_path, mode, tier):
    with open_store(tmp_path, mode, host_slots=2, nvme=True) as store:
        store.put(b"k", b"old value", tier)
        with store.reserve(b"k", 5, tier) as r:
            r.buffer[:] = np.frombuffer(b"fresh", np.uint8)
        assert store.get(b"k") == b"fresh" and r.owner is None
        with pytest.raises(ProducerFailed), store.reserve(b"k", 4, tier) as r:
            r.buffer[:] = 9
            raise ProducerFailed  # the producer crashed mid-write
        assert store.get(b"k") == b"fresh"  # aborted: the committed value stays
        with pytest.raises(ReservationClosed):
            store.commit(r)
        with store.reserve(b"j", 3, tier) as r:  # finished inside: the exit leaves it be
            r.buffer[:] = 1
            store.abort(r)
        assert not store.contains(b"j")
        with store.reserve(b"j", 3, tier) as r:
            r.buffer[:] = 2
            assert store.commit(r) is tier
        assert store.get(b"j") == bytes([2]) * 3
        held = 2 if tier is Tier.HOST else 0
        assert store.host.stats().used_slots == held  # k and j; nothing leaked


def test_a_failed_producer_in_a_full_pool_gives_the_slot_back(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        for _ in range(3):  # used to leak the only slot: NoRoom from the second round on
            with pytest.raises(ProducerFailed), store.reserve(b"k", 100):
                raise ProducerFailed
        assert store.put(b"k", b"fits") is Tier.HOST and store.get(b"k") == b"fits"


def test_a_dropped_reservation_gives_its_slot_back_at_the_next_call(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        r = store.reserve(b"a", 1000)
        r.buffer[:] = 7
        del r
        gc.collect()
        assert store.put(b"b", b"takes the slot") is Tier.HOST  # used to be NoRoom
        assert store.get(b"b") == b"takes the slot" and not store.contains(b"a")
        assert store.host.stats().used_slots == 1


def test_a_dropped_reservation_never_frees_a_slot_another_key_uses(tmp_path, mode):
    with open_store(tmp_path, mode, host_slots=3) as store:
        committed = store.reserve(b"a", 4)
        committed.buffer[:] = 65
        store.commit(committed)
        aborted = store.reserve(b"x", 4)
        store.abort(aborted)
        store.put(b"b", b"BBBB")  # takes the slot the aborted reservation held
        del committed, aborted
        gc.collect()
        store.put(b"c", b"CCCC")  # the next call: nothing to give back
        assert store.get(b"a") == b"AAAA" and store.get(b"b") == b"BBBB"
        assert store.get(b"c") == b"CCCC" and store.host.stats().used_slots == 3
        with pytest.raises(NoRoom):
            store.put(b"d", b"no fourth slot")


def test_a_reservation_dropped_after_close_touches_nothing(tmp_path, mode):
    store = open_store(tmp_path, mode, nvme=True)
    held = [store.reserve(b"h", 10), store.reserve(b"n", 10, Tier.NVME)]
    store.close()
    del held
    gc.collect()
    store.close()  # nothing raised, nothing given back to a closed pool


def test_a_dropped_sealed_reservation_gives_its_staging_buffer_back(tmp_path):
    with open_store(tmp_path, "sealed", nvme=True) as store:
        first = store.reserve(b"n", 10, Tier.NVME)
        spare = first.buffer.base if first.buffer.base is not None else first.buffer
        del first
        gc.collect()
        again = store.reserve(b"m", 10, Tier.NVME)  # the spare again, not a new buffer
        assert np.shares_memory(again.buffer, spare)
        again.buffer[:] = 4
        store.commit(again)
        assert store.get(b"m") == bytes([4]) * 10
