"""Stores and restores in one pool overlap (real NIXL, real /dev/shm, real AES-GCM, a real
NVMe shard; the actors in this process): only the pool's index and slot bookkeeping are
under its lock, so a store never waits for another store's directory round trip or
sealing, nor for an NVMe restore's read; a page deleted, or a tenant erased, while its
store or its NVMe restore is in flight keeps no copy and pushes nothing; and stores read
the directory's generation once per namespace."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.pool_actor import PageMissing
from agentkv_cluster.runtime.pool_records import StoredCopy
from agentkv_cluster.runtime.records import PageMeta, PoolReceipt
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
PAGE = MIB + 77
WAIT_S = 10.0  # a store that should finish at once; one that waits would wait forever


@pytest.fixture
def pool(tmp_path):
    with local_topology(tmp_path, hbm_page=2 * MIB, hbm_pages=2, pool_bytes=8 * MIB,
                        front_bytes=PAGE, front_slots=2) as (topo, front):
        rng = np.random.default_rng(3)
        for slot in (0, 1):
            front.slot_view(slot, PAGE)[:] = rng.integers(1, 256, PAGE, dtype=np.uint8)
        yield topo.pools["node0"], front


def _meta(name: bytes) -> PageMeta:
    return PageMeta(key=name * 32, digest=b"d" * 32, tenant="acme", namespace="acme",
                    session="s", page_id=0, state_type=StateType.EVIDENCE, length=PAGE,
                    tokens=1)


class _Held:
    """Wraps one of the pool's collaborators: ``method`` blocks (for page ``key``) until
    ``release`` is set; ``entered`` says the call got that far."""

    def __init__(self, inner: Any, method: str, key: bytes) -> None:
        self.inner, self.method, self.key = inner, method, key
        self.entered, self.release = threading.Event(), threading.Event()
        self.slots: list[int] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def held(*args: Any, **kwargs: Any) -> Any:
            keys = [a if isinstance(a, bytes) else getattr(a, "key", None) for a in args]
            if self.key in keys:
                self.slots += [a.slot for a in args if isinstance(a, StoredCopy)]
                self.entered.set()
                assert self.release.wait(WAIT_S), "never released"
            return attr(*args, **kwargs)

        return held


def _in_thread(call: Any) -> tuple[threading.Thread, list]:
    """Run ``call`` in a thread; the list gets its result or its exception."""
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _store_in_thread(pool, front, slot: int, name: bytes) -> tuple[threading.Thread, list]:
    return _in_thread(lambda: pool.store_from(_meta(name), Tier.HOST, Codec.FULL,
                                              front.slot_span(slot, PAGE)))


def _restore_in_thread(actor, front, slot: int, name: bytes) -> tuple[threading.Thread, list]:
    return _in_thread(lambda: actor.restore_to(name * 32, b"d" * 32, int(Codec.FULL),
                                               front.slot_span(slot, PAGE).wire()))


def test_a_store_does_not_wait_for_another_stores_directory_write(pool) -> None:
    handle, front = pool
    actor = handle.target
    held = _Held(actor.publisher.directory, "put", b"a" * 32)
    actor.publisher.directory = held
    first, first_out = _store_in_thread(handle, front, 0, b"a")
    assert held.entered.wait(WAIT_S)  # page a is sealed and committed, its entry not written
    second, second_out = _store_in_thread(handle, front, 1, b"b")
    second.join(WAIT_S)
    finished_while_held = not second.is_alive()
    held.release.set()
    first.join(WAIT_S)
    assert finished_while_held, "the second store waited for the first's directory write"
    assert first_out == second_out == [PoolReceipt(tier=Tier.HOST, nbytes=PAGE)]
    assert [h is not None for h in handle.holds_many([b"a" * 32, b"b" * 32])] == [True, True]


@pytest.mark.parametrize("how", ["delete", "erase"])
def test_a_page_deleted_or_erased_while_stored_keeps_no_copy(pool, how: str) -> None:
    handle, front = pool
    actor = handle.target
    free_before = actor.host.stats().free_slots
    held = _Held(actor.records, "into_slot", b"a" * 32)
    actor.records = held
    thread, out = _store_in_thread(handle, front, 0, b"a")
    assert held.entered.wait(WAIT_S)  # in flight: slot allocated, not yet sealed
    if how == "delete":
        assert handle.delete(b"a" * 32, "acme") == 0  # nothing committed yet
    else:
        actor.purge_tenant("acme")
    held.release.set()
    thread.join(WAIT_S)
    (result,) = out
    assert isinstance(result, PageMissing), result
    assert handle.holds_many([b"a" * 32]) == [None]
    assert actor.host.stats().free_slots == free_before
    (slot,) = held.slots
    at = actor.host.slot_offset(slot)
    assert not actor.host.buffer[at:at + actor.host.slot_bytes].any()  # scrubbed


def test_a_restore_of_a_copy_being_stored_again_waits_and_reads_the_new_one(pool) -> None:
    """The store drops the old copy when it starts; a restore of that copy meanwhile
    waits for the new one instead of failing with ``PageMissing``."""
    handle, front = pool
    actor = handle.target
    first = front.slot_view(0, PAGE).tobytes()
    assert handle.store_from(_meta(b"a"), Tier.HOST, Codec.FULL,
                             front.slot_span(0, PAGE)).tier is Tier.HOST
    held = _Held(actor.records, "into_slot", b"a" * 32)
    actor.records = held
    storing, stored = _store_in_thread(handle, front, 1, b"a")  # the page, stored again
    assert held.entered.wait(WAIT_S)
    second = front.slot_view(1, PAGE).tobytes()
    assert second != first
    reader, restored = _restore_in_thread(actor, front, 0, b"a")
    reader.join(0.5)
    waited = reader.is_alive()  # a restore that did not wait has failed by now
    held.release.set()
    storing.join(WAIT_S)
    reader.join(WAIT_S)
    assert waited, restored
    assert stored == [PoolReceipt(tier=Tier.HOST, nbytes=PAGE)]
    assert restored == [(int(Tier.HOST), PAGE)]
    assert front.slot_view(0, PAGE).tobytes() == second


def _on_nvme(handle, front, name: bytes) -> bytes:
    """Store page ``name`` from front slot 0 on NVMe; returns its bytes."""
    assert handle.store_from(_meta(name), Tier.NVME, Codec.FULL,
                             front.slot_span(0, PAGE)).tier is Tier.NVME
    return front.slot_view(0, PAGE).tobytes()


def _beside_a_held_nvme_read(handle, front, call: Any) -> tuple[list, bool, list]:
    """Restore NVMe page a into front slot 1 with its shard read held, and run ``call``
    meanwhile. Returns the restore's outcome, whether ``call`` finished while the read
    was held, and its outcome."""
    actor = handle.target
    held = _Held(actor.nvme, "get", actor._index[(b"a" * 32, Codec.FULL)].nkey)
    actor.nvme = held
    reader, restored = _restore_in_thread(actor, front, 1, b"a")
    assert held.entered.wait(WAIT_S)
    other, out = _in_thread(call)
    other.join(WAIT_S)
    finished_while_held = not other.is_alive()
    held.release.set()
    reader.join(WAIT_S)
    other.join(WAIT_S)
    return restored, finished_while_held, out


def test_an_nvme_restore_does_not_hold_the_pool_lock(pool) -> None:
    """The record is read into a buffer of the restore's own, outside the lock: a store
    of another page goes on while the read is held."""
    handle, front = pool
    data = _on_nvme(handle, front, b"a")
    restored, finished_while_held, stored = _beside_a_held_nvme_read(
        handle, front, lambda: handle.store_from(_meta(b"b"), Tier.HOST, Codec.FULL,
                                                 front.slot_span(0, PAGE)))
    assert finished_while_held, "a store waited for an NVMe restore's read"
    assert stored == [PoolReceipt(tier=Tier.HOST, nbytes=PAGE)]
    assert restored == [(int(Tier.NVME), PAGE)]
    assert front.slot_view(1, PAGE).tobytes() == data


def test_an_nvme_copy_deleted_while_read_is_not_pushed(pool) -> None:
    """A restore whose NVMe copy is deleted during its read starts over, finds no copy
    and says so; the destination never sees a byte, and no other copy is dropped."""
    handle, front = pool
    _on_nvme(handle, front, b"a")
    front.slot_view(1, PAGE)[:] = 0
    restored, finished_while_held, gone = _beside_a_held_nvme_read(
        handle, front, lambda: handle.delete(b"a" * 32, "acme"))
    assert finished_while_held, "a delete waited for an NVMe restore's read"
    assert gone == [1]
    (result,) = restored
    assert isinstance(result, PageMissing), result
    assert not front.slot_view(1, PAGE).any()
    assert handle.target.stats()["rejects"] == 0


def test_stores_read_the_generation_once_and_repair_an_emptied_directory(pool) -> None:
    """The generation a namespace's entries carry is read by its first store only; an
    emptied directory refuses the next entry, which is advanced back and published."""
    from store.directory import EmbeddedDirectory
    from store.types import Lookup

    handle, front = pool
    actor = handle.target
    publisher = actor.publisher
    for name in (b"a", b"b", b"c"):
        handle.store_from(_meta(name), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    assert publisher.reads == 1
    shell = publisher.directory.target
    ns = actor.blinder.namespace("acme")
    gen = shell.current_generation(ns)
    assert gen >= 1
    shell.inner = EmbeddedDirectory()  # the directory lost everything
    handle.store_from(_meta(b"d"), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    assert not publisher.stale
    assert shell.current_generation(ns) == gen
    lookup, entry = shell.get(ns, b"d" * 32)
    assert lookup is Lookup.HIT and entry.generation == gen
