"""Pool restores (real NIXL, real /dev/shm, real AES-GCM; the actors in this process): a page
sealed in chunks comes back byte-identical from host and NVMe, a tampered copy is rejected
and counted, and a copy rewritten while it is opened straight from shared memory is retried,
never served torn and never counted as tampering."""

from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.mover import MoveError, Mover
from agentkv_cluster.runtime.pool_actor import PageMissing, PoolActor, SealRejected
from agentkv_cluster.runtime.records import (
    DemoteReceipt,
    KvShape,
    PageMeta,
    PoolHolding,
    PoolReceipt,
    RestoreReceipt,
)
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
PAGE = 5 * MIB + 123  # three sealed chunks: 2 MiB, 2 MiB and the rest


@pytest.fixture
def service(tmp_path):
    with local_topology(tmp_path, hbm_page=6 * MIB, hbm_pages=2, pool_bytes=12 * MIB,
                        front_bytes=PAGE, front_slots=2) as (topo, front):
        yield topo.hbms["node0-hbm0"].target, topo.pools["node0"], front


def _meta(length: int = PAGE) -> PageMeta:
    return PageMeta(key=b"k" * 32, digest=b"d" * 32, tenant="acme", namespace="acme",
                    session="s", page_id=0, state_type=StateType.EVIDENCE, length=length,
                    tokens=1)


def _pages(front: Mover) -> list[bytes]:
    rng = np.random.default_rng(7)
    pages = []
    for slot in (0, 1):
        data = rng.integers(0, 256, PAGE, dtype=np.uint8)
        front.slot_view(slot, PAGE)[:] = data
        pages.append(data.tobytes())
    return pages


def _store(pool, front: Mover, slot: int, tier: Tier) -> dict[str, int]:
    return pool.store_from(_meta(), tier, Codec.FULL, front.slot_span(slot, PAGE))


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
def test_chunked_page_restores_byte_identical(service, tier):
    hbm, pool, front = service
    pages = _pages(front)
    assert _store(pool, front, 1, tier) == PoolReceipt(tier=tier, nbytes=PAGE)
    wire = hbm.restore(_meta(), int(tier), int(Codec.FULL), pool)
    msgpack.packb(wire)  # the actor answers plain values; its handle types them
    receipt = RestoreReceipt.from_wire(wire)
    assert (receipt.tier, receipt.link_bytes, receipt.exact) == (int(tier), PAGE, True)
    assert hbm.read(b"k" * 32)[:PAGE] == pages[1]
    span = hbm.span(b"k" * 32)  # the controller's entry point, into the same arena page
    assert pool.restore_to(b"k" * 32, b"d" * 32, int(Codec.FULL), span.wire()) \
        == PoolReceipt(tier=tier, nbytes=PAGE)
    assert hbm.read(b"k" * 32)[:PAGE] == pages[1]
    assert {k: pool.stats()[k] for k in ("rejects", "torn")} == {"rejects": 0, "torn": 0}


def test_restore_boundary_rejects_unknown_codecs_and_missing_copies(service):
    hbm, pool, front = service
    _pages(front)
    _store(pool, front, 0, Tier.HOST)
    hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), pool)
    wire = hbm.span(b"k" * 32).wire()
    with pytest.raises(ValueError):
        pool.restore_to(b"k" * 32, b"d" * 32, 99, wire)
    with pytest.raises(PageMissing):
        pool.restore_to(b"k" * 32, b"d" * 32, int(Codec.INT8), wire)
    with pytest.raises(PageMissing):
        pool.restore_to(b"x" * 32, b"d" * 32, int(Codec.FULL), wire)
    with pytest.raises(SealRejected):  # another page's identity does not open this copy
        pool.restore_to(b"k" * 32, b"e" * 32, int(Codec.FULL), wire)
    assert pool.stats()["rejects"] == 1


def test_a_copy_larger_than_its_destination_span_is_not_pushed(service):
    hbm, pool, front = service
    pages = _pages(front)
    _store(pool, front, 0, Tier.HOST)
    hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), pool)
    _store(pool, front, 1, Tier.HOST)  # a newer version of the page in the pool
    short = (*hbm.span(b"k" * 32).wire()[:4], PAGE - 1)  # one byte short of the copy
    with pytest.raises(MoveError, match="does not fit"):
        pool.restore_to(b"k" * 32, b"d" * 32, int(Codec.FULL), short)
    assert hbm.read(b"k" * 32)[:PAGE] == pages[0]  # not a byte of the new version landed
    assert pool.stats()["rejects"] == 0


def test_tampered_host_copy_is_rejected_counted_and_not_left_in_hbm(service):
    hbm, pool, front = service
    _pages(front)
    _store(pool, front, 0, Tier.HOST)
    actor = pool.target
    slot = actor._index[(b"k" * 32, Codec.FULL)].slot
    at = actor.host.slot_offset(slot) + actor.host.stats().used_bytes - 3 * MIB  # mid chunk 1
    actor.host.buffer[at] ^= 0x01  # an attacker's bit flip, not a write: the seqlock stays put
    with pytest.raises(SealRejected):
        hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), pool)
    assert pool.stats()["rejects"] == 1 and pool.stats()["torn"] == 0
    assert hbm.stats()["pages"] == 0  # the restore dropped its half-written page


def test_copy_rewritten_while_opened_is_retried_never_torn_never_a_reject(service):
    hbm, pool, front = service
    pages = _pages(front)
    _store(pool, front, 0, Tier.HOST)
    stop = threading.Event()
    stores = [0]

    def rewrite() -> None:  # the same page, alternately version 0 and 1, into reused slots
        while not stop.is_set():
            _store(pool, front, stores[0] % 2, Tier.HOST)
            stores[0] += 1

    writer = threading.Thread(target=rewrite)
    writer.start()
    served, missing = [], 0
    try:
        deadline = time.monotonic() + 90  # ends once it raced: seconds on a quiet box
        while time.monotonic() < deadline and (pool.stats()["torn"] < 3 or len(served) < 5):
            try:
                hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), pool)
            except PageMissing:  # rewritten on every retry
                missing += 1
                continue
            served.append(hbm.read(b"k" * 32)[:PAGE])
    finally:
        stop.set()
        writer.join()
    assert stores[0] > 1  # the writer ran (how many times depends on the box; torn >= 3 shows the race)
    assert all(page in pages for page in served)  # whole old or whole new, never a mix
    assert pool.stats()["rejects"] == 0
    assert pool.stats()["torn"] >= 3, (pool.stats(), len(served), missing)  # control: it raced


def test_an_nvme_copy_stored_again_while_restored_is_read_again_not_a_reject(service):
    """A store of a page writes its NVMe record under the key the old record had and commits
    the copy to the index after: a restore reading between the two met the new record with
    the old copy's binding, counted it as tampering and failed. It now waits for the store
    and serves the new copy. The re-store writes at the moment the restore reads, and
    commits once the restore opened what it read."""
    hbm, pool, front = service
    pages = _pages(front)
    _store(pool, front, 0, Tier.NVME)
    actor = pool.target
    written, opened = threading.Event(), threading.Event()
    to_nvme, get, open_and_push = actor.records.to_nvme, actor.nvme.get, actor.opener.open_and_push

    def to_nvme_then_wait(*args) -> None:  # on the shard; in the index once the open ended
        to_nvme(*args)
        written.set()
        opened.wait(30)

    def get_meanwhile(*args, **kwargs):
        if not written.is_set():
            threading.Thread(target=_store, args=(pool, front, 1, Tier.NVME)).start()
            written.wait(30)
        return get(*args, **kwargs)

    def open_then_commit(*args):
        try:
            return open_and_push(*args)
        finally:
            opened.set()

    actor.records.to_nvme, actor.nvme.get = to_nvme_then_wait, get_meanwhile
    actor.opener.open_and_push = open_then_commit
    try:
        hbm.restore(_meta(), int(Tier.NVME), int(Codec.FULL), pool)
    finally:
        del actor.records.to_nvme, actor.nvme.get, actor.opener.open_and_push
    assert hbm.read(b"k" * 32)[:PAGE] == pages[1]
    assert pool.stats()["rejects"] == 0


def test_moves_may_name_a_pool_handed_over_once(service):
    hbm, pool, front = service
    pages = _pages(front)
    _store(pool, front, 0, Tier.HOST)
    with pytest.raises(KeyError):  # a name the HBM actor was never given
        hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), "node0")
    hbm.add_pool("node0", pool)
    receipt = RestoreReceipt.from_wire(
        hbm.restore(_meta(), int(Tier.HOST), int(Codec.FULL), "node0"))
    assert receipt.exact and hbm.read(b"k" * 32)[:PAGE] == pages[0]
    wire = hbm.demote(_meta(), [(int(Tier.NVME), int(Codec.FULL))], "node0", False)
    msgpack.packb(wire)
    demoted = DemoteReceipt.from_wire(wire)
    assert demoted.copies == ((int(Tier.NVME), int(Codec.FULL)),)
    assert (demoted.tier_bytes, demoted.link_bytes, demoted.pool) == ((PAGE,), PAGE, "node0")


def test_a_restarted_pool_drops_the_nvme_records_of_an_erased_tenant(service):
    """An erased tenant's NVMe record can never open again (its keys are destroyed): a
    pool that restarts while it is on disk drops it from the shard instead of keeping it."""
    _hbm, pool, front = service
    _pages(front)
    _store(pool, front, 1, Tier.NVME)
    actor = pool.target
    assert len(list(actor.nvme.keys())) == 1
    actor.keyring.destroy_tenant("acme")  # crypto-shred: the tenant is erased
    actor.close(unlink=False)  # the process dies; its segment and shard stay on disk
    again = PoolActor(actor.spec, actor.directory)
    try:
        assert list(again.nvme.keys()) == []
        with pytest.raises(PageMissing):
            again.restore_to(b"k" * 32, b"d" * 32, int(Codec.FULL),
                             front.slot_span(0, PAGE).wire())
    finally:
        again.close()


@pytest.mark.parametrize("tier", [Tier.HOST, Tier.NVME])
def test_holds_many_answers_each_page_in_plain_values(service, tier):
    _hbm, pool, front = service
    _pages(front)
    _store(pool, front, 0, tier)
    missing = b"m" * 32
    wire = pool.target.holds_many([b"k" * 32, missing])
    msgpack.packb(wire)  # the actor's answer travels as plain values, not a pickled class
    assert pool.holds_many([b"k" * 32, missing]) == [
        PoolHolding(copies=((tier, Codec.FULL),), length=PAGE, state_type=StateType.EVIDENCE,
                    shape=None), None]


def test_a_pool_holding_keeps_its_kv_shape_through_the_wire():
    shape = KvShape(layers=2, kv_heads=4, tokens=16, head_dim=64, dtype="bfloat16")
    held = PoolHolding(copies=((Tier.HOST, Codec.INT8), (Tier.NVME, Codec.FULL)), length=4096,
                       state_type=StateType.FIXED_PREFIX, shape=shape)
    assert PoolHolding.from_wire(msgpack.unpackb(msgpack.packb(held.wire()))) == held
    assert KvShape.from_stored(shape.stored()) == shape and KvShape.from_stored(None) is None
