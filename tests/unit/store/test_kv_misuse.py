"""The keyed library store (store.kv) used wrongly, from outside: reservations finished
twice or left in flight together, bad lengths and tiers, a full disk, a closed store,
strided values, a pool segment a crashed process left behind, and a store opened under
the wrong tenant. Each gives a typed error and loses nothing already stored."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.errors import KeyUnavailable
from security.memory_keys import memory_keyring
from store.host_pool import SHM_DIR, PoolBusy
from store.kv import (
    ForeignTenant,
    KVStore,
    KVStoreConfig,
    NoRoom,
    ReservationClosed,
    Sealing,
    StoreClosed,
)
from store.nvme import NvmeShardConfig, ShardError
from store.types import Tier

SLOT = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["plain", "sealed"])
def mode(request) -> str:
    return request.param


def open_store(tmp_path: Path, mode: str, *, host_slots: int = 4, name: str | None = None,
               nvme: NvmeShardConfig | None = None, ring=None, tenant: str = "acme") -> KVStore:
    sealing = None
    if mode == "sealed":
        sealing = Sealing(keyring=ring or memory_keyring("acme"), tenant=tenant)
    config = KVStoreConfig(name=name or f"akv-kv-misuse-{uuid.uuid4().hex[:10]}",
                           slot_bytes=SLOT, host_slots=host_slots, nvme_dir=str(tmp_path / "nv"),
                           nvme=nvme or NvmeShardConfig())
    return KVStore(config, sealing)


def test_a_reservation_is_finished_once_and_a_stale_one_touches_nothing(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        store.put(b"a", b"old-a")
        r = store.reserve(b"b", 4)
        r.buffer[:] = 66
        assert store.commit(r) is Tier.HOST
        with pytest.raises(ReservationClosed):
            store.commit(r)  # used to free b's slot: b was gone
        store.abort(r)  # a no-op, not a free of b's slot
        assert store.get(b"b") == b"BBBB"
        r = store.reserve(b"a", 4)
        store.abort(r)
        store.abort(r)
        with pytest.raises(ReservationClosed):
            store.commit(r)  # used to delete a's old value
        assert store.get(b"a") == b"old-a"
        store.delete(b"b")
        store.put(b"c", b"CCCC")  # may take b's old slot
        with pytest.raises(ReservationClosed):
            store.commit(r)
        assert store.get(b"c") == b"CCCC" and not store.contains(b"b")
        assert store.host.stats().used_slots == 2  # a and c: nothing leaked or freed twice
        with open_store(tmp_path / "other", mode) as other, pytest.raises(ReservationClosed):
            other.commit(store.reserve(b"d", 3))


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
def test_reservations_in_flight_never_share_a_buffer(tmp_path, mode, tier):
    with open_store(tmp_path, mode) as store:
        first, second = store.reserve(b"1", 4096, tier), store.reserve(b"2", 4096, tier)
        first.buffer[:] = 1
        second.buffer[:] = 2
        assert store.commit(first) is tier and store.commit(second) is tier
        third = store.reserve(b"3", 10, tier)  # the spare buffer again, once returned
        third.buffer[:] = 3
        store.commit(third)
        assert store.get(b"1") == bytes([1]) * 4096 and store.get(b"2") == bytes([2]) * 4096
        assert store.get(b"3") == bytes([3]) * 10


def test_bad_lengths_and_tiers_are_refused_and_hold_nothing(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        for tier in (Tier.HOST, Tier.NVME):
            with pytest.raises(ValueError):
                store.reserve(b"k", -5, tier)  # NVMe: used to store slot_bytes - 5 bytes
            for bad in (10.0, "10", None, True):  # True held one byte
                with pytest.raises(TypeError):
                    store.reserve(b"k", bad, tier)
        assert store.host.stats().used_slots == 0 and len(store.nvme) == 0  # no slot leaked
        for bad in (Tier.HBM, "host", 7, True):
            with pytest.raises(ValueError):
                store.put(b"k", b"x", bad)  # used to go to NVMe
        assert store.put(b"k", b"x", 1) is Tier.HOST  # Tier is an IntEnum
        assert not store.contains(b"nothing") and store.get(b"k") == b"x"


def test_a_write_the_disk_refuses_keeps_the_old_value(tmp_path, mode):
    with open_store(tmp_path, mode, host_slots=1, nvme=NvmeShardConfig(max_bytes=256 << 10)
                    ) as store:
        assert store.put(b"h", b"host-old") is Tier.HOST
        store.put(b"n", b"nvme-old", Tier.NVME)
        big = bytes(600 << 10)
        raised = []
        for key in (b"n", b"h"):
            with pytest.raises((ShardError, NoRoom)) as put:
                store.put(key, big, Tier.NVME)
            r = store.reserve(key, len(big), Tier.NVME)
            with pytest.raises((ShardError, NoRoom)) as commit:
                store.commit(r)
            raised += [put.type, commit.type]
        assert store.get(b"n") == b"nvme-old" and store.get(b"h") == b"host-old"  # were lost
        assert set(raised) == {NoRoom}  # the shard's DiskFull, as the store's own error


def test_a_delete_the_full_disk_cannot_record_is_the_stores_no_room(tmp_path, mode,
                                                                    monkeypatch):
    """No room left even for a tombstone: the shard's ``DiskFull`` came out of ``delete``
    (and of a put over an NVMe key) as it was, not as a store error. The value stays."""
    from store.nvme import DiskFull, NvmeShard

    def full(*_args: object) -> None:
        raise DiskFull("no room for a tombstone")

    with open_store(tmp_path, mode) as store:
        store.put(b"n", b"nvme-old", Tier.NVME)
        monkeypatch.setattr(NvmeShard, "delete", full)
        for call in (lambda: store.delete(b"n"), lambda: store.put(b"n", b"new", Tier.HOST)):
            with pytest.raises(NoRoom, match="no room on NVMe to record its deletion"):
                call()
        assert store.get(b"n") == b"nvme-old" and store.host.stats().used_slots == 0


def test_a_nameless_nvme_dir_is_refused():
    with pytest.raises(ValueError, match="nvme_dir must name a directory"):
        KVStoreConfig(name="x", slot_bytes=4096, nvme_dir="")


def test_a_closed_store_says_so(tmp_path, mode):
    store = open_store(tmp_path, mode)
    store.put(b"a", b"x")
    r = store.reserve(b"b", 3)
    store.close()
    store.close()
    for call in (lambda: store.get(b"a"), lambda: store.put(b"b", b"y"),
                 lambda: store.contains(b"a"), lambda: store.delete(b"a"),
                 lambda: store.reserve(b"c", 3), lambda: store.commit(r),
                 lambda: store.drop_cache(b"a")):
        with pytest.raises(StoreClosed):  # used to be AttributeError, or a stale answer
            call()
    store.abort(r)  # nothing left to give back


def test_a_second_close_leaves_a_newer_store_of_the_same_name_alone(tmp_path, mode):
    """A store closed twice used to unlink its pool segment's name again, which by then
    named the segment of a store reopened under it: a third store then opened beside
    that live one (each with its own values under one name) instead of ``PoolBusy``."""
    name = f"akv-kv-misuse-{uuid.uuid4().hex[:10]}"
    old = open_store(tmp_path, mode, name=name)
    old.close()
    with open_store(tmp_path / "new", mode, name=name) as new:
        new.put(b"k", b"new")
        old.close()
        assert os.path.exists(os.path.join(SHM_DIR, name))
        with pytest.raises(PoolBusy):
            open_store(tmp_path / "third", mode, name=name)
        assert new.get(b"k") == b"new"
    assert not os.path.exists(os.path.join(SHM_DIR, name))  # its own close unlinks it


def test_arrays_of_python_objects_and_foreign_objects_are_type_errors(tmp_path, mode):
    with open_store(tmp_path, mode) as store:
        for tier in (Tier.HOST, Tier.NVME):
            for value in (np.array([object(), 1]), memoryview(np.zeros(3, object))):
                with pytest.raises(TypeError):  # a memoryview used to store the addresses
                    store.put(b"o", value, tier)
        assert not store.contains(b"o")
        for call in (store.commit, store.abort):
            with pytest.raises(TypeError):  # used to be AttributeError
                call(None)


def test_strided_values_are_stored_in_c_order(tmp_path, mode):
    grid = np.arange(64, dtype=np.float32).reshape(8, 8)
    raw = memoryview(bytes(range(100)))
    with open_store(tmp_path, mode) as store:
        for tier in (Tier.HOST, Tier.NVME):
            store.put(b"cols", grid[:, ::2], tier)  # used to be a numpy ValueError
            assert store.get(b"cols") == grid[:, ::2].tobytes()
            store.put(b"f", np.asfortranarray(grid), tier)
            assert store.get(b"f") == grid.tobytes()
            store.put(b"m", raw[::2], tier)
            assert store.get(b"m") == bytes(range(0, 100, 2))


def test_a_pool_segment_left_by_a_crashed_writer_is_replaced(tmp_path):
    name = f"akv-kv-misuse-{uuid.uuid4().hex[:10]}"
    crash = (f"import os\nfrom store.kv import KVStore, KVStoreConfig\n"
             f"s = KVStore(KVStoreConfig(name={name!r}, slot_bytes=4096, host_slots=2))\n"
             f"s.put(b'a', b'x')\nos.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", crash], cwd=ROOT, check=False, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert done.returncode == -9 and (Path(SHM_DIR) / name).exists(), done.stderr
    with open_store(tmp_path, "plain", name=name) as store:  # used to be FileExistsError
        store.put(b"a", b"new")
        with pytest.raises(PoolBusy):
            open_store(tmp_path / "2", "plain", name=name)  # a live store is never replaced
        assert store.get(b"a") == b"new"
    foreign = Path(SHM_DIR) / f"akv-kv-misuse-{uuid.uuid4().hex[:10]}"
    foreign.write_bytes(b"not a pool")
    try:
        with pytest.raises(FileExistsError):
            open_store(tmp_path / "3", "plain", name=foreign.name)
        assert foreign.read_bytes() == b"not a pool"
    finally:
        foreign.unlink()


def test_a_store_opened_under_the_wrong_tenant_wipes_nothing(tmp_path):
    ring = memory_keyring("acme", "other")
    with open_store(tmp_path, "sealed", ring=ring) as store:
        store.put(b"k", b"acme's value", Tier.NVME)
    name = f"akv-kv-misuse-{uuid.uuid4().hex[:10]}"
    with pytest.raises(KeyUnavailable):
        open_store(tmp_path, "sealed", ring=ring, tenant="acme-typo", name=name)
    with pytest.raises(ForeignTenant):  # used to retire acme's records as "do not open"
        open_store(tmp_path, "sealed", ring=ring, tenant="other", name=name)
    assert not (Path(SHM_DIR) / name).exists()  # no pool segment left behind either
    with open_store(tmp_path, "sealed", ring=ring) as store:
        assert store.get(b"k") == b"acme's value"
