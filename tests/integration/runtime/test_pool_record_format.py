"""Pool record formats (real NIXL, /dev/shm, NVMe files, AES-GCM; no Ray): version-2 records
show neither the tenant nor the page key nor its exact length on any tier, a restarted index
finds them again through the keyring, and version-1 records written by the old code are
still restored byte-identical, and a record whose header is no index entry is dropped at a
rebuild instead of stopping it."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.pool_records import StoredCopy, build_record_v1, slot_identity
from agentkv_cluster.runtime.records import PageMeta, RestoreReceipt
from agentkv_cluster.runtime.tenants import ensure_tenant
from security.chunked import record_size
from store.host_pool import SHM_DIR
from store.types import Codec, Lookup, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
PAGE = 3 * MIB + 4321


@pytest.fixture
def service(tmp_path):
    with local_topology(tmp_path, hbm_page=4 * MIB, hbm_pages=2, pool_bytes=16 * MIB,
                        front_bytes=PAGE, front_slots=1) as (topo, front):
        yield topo.hbms["node0-hbm0"].target, topo.pools["node0"], front, tmp_path


def _meta(key: bytes) -> PageMeta:
    return PageMeta(key=key, digest=key[::-1], tenant="acme", namespace="acme", session="s",
                    page_id=0, state_type=StateType.EVIDENCE, length=PAGE, tokens=1)


def _page(front, seed: int) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)
    front.slot_view(0, PAGE)[:] = data
    return data.tobytes()


def _restored(hbm, pool, key: bytes, tier: Tier) -> bytes:
    receipt = RestoreReceipt.from_wire(hbm.restore(_meta(key), int(tier), int(Codec.FULL), pool))
    assert receipt.exact
    return hbm.read(key)[:PAGE]


def test_version_2_records_name_nothing_and_survive_a_rebuild(service):
    hbm, pool, front, workdir = service
    actor = pool.target
    host_key, nvme_key = b"H" * 32, b"N" * 32
    pages = {}
    for key, tier, seed in ((host_key, Tier.HOST, 1), (nvme_key, Tier.NVME, 2)):
        pages[key] = _page(front, seed)
        assert pool.store_from(_meta(key), tier, Codec.FULL, front.slot_span(0, PAGE)).tier \
            is tier
    host_copy = actor._index[(host_key, Codec.FULL)]
    nvme_copy = actor._index[(nvme_key, Codec.FULL)]
    assert actor.host.stats().used_bytes == record_size(PAGE) == record_size(3 * MIB + 1)
    _, loc = actor.nvme.locate(nvme_copy.nkey)
    assert loc.length == record_size(PAGE) and loc.generation == 0
    assert nvme_copy.nkey == slot_identity(nvme_key, Codec.FULL)
    blobs = [(Path(SHM_DIR) / actor.host.name).read_bytes()]
    blobs += [p.read_bytes() for p in (workdir / "nv").rglob("*.akv")]
    for blob in blobs:
        for secret in (b"acme", host_key, nvme_key, PAGE.to_bytes(8, "big"),
                       host_copy.loc.to_bytes(8, "big"), nvme_copy.loc.to_bytes(8, "big")):
            assert secret not in blob
    actor._index.clear()  # a restarted actor: the index comes back from the records alone
    actor._rebuild()
    for key, tier in ((host_key, Tier.HOST), (nvme_key, Tier.NVME)):
        copy = actor._index[(key, Codec.FULL)]
        assert (copy.tier, copy.nbytes, copy.namespace, copy.version) == (tier, PAGE, "acme", 2)
        assert _restored(hbm, pool, key, tier) == pages[key]
    assert pool.stats()["rejects"] == 0


def test_version_1_records_are_still_read(service):
    hbm, pool, front, _ = service
    actor = pool.target
    gen = actor.keyring.current_generation("acme")
    pages = {}
    for key, tier, seed in ((b"h" * 32, Tier.HOST, 3), (b"n" * 32, Tier.NVME, 4)):
        pages[key] = _page(front, seed)
        copy = StoredCopy(tier=tier, slot=-1, loc=4242 + seed, seal_gen=gen, dir_gen=1,
                          nbytes=PAGE, namespace="acme", full=PAGE, state_type="evidence")
        record = build_record_v1(actor.sealer, key, Codec.FULL, copy, _meta(key).digest,
                                 pages[key])
        assert record[:4] == b"AKVR" and b"acme" in record  # the old plaintext header
        if tier is Tier.HOST:
            actor.host.write(actor.host.alloc(), record)
        else:
            actor.nvme.put(copy.nkey, record, 1)
    actor._index.clear()
    actor._rebuild()
    for key, tier in ((b"h" * 32, Tier.HOST), (b"n" * 32, Tier.NVME)):
        assert actor._index[(key, Codec.FULL)].version == 1
        assert _restored(hbm, pool, key, tier) == pages[key]
    # a version-1 copy replaced by a new store leaves no old record behind
    _page(front, 5)
    pool.store_from(_meta(b"n" * 32), Tier.NVME, Codec.FULL, front.slot_span(0, PAGE))
    assert actor.nvme.locate(b"n" * 32 + b"\0")[0] is Lookup.MISS
    assert actor._index[(b"n" * 32, Codec.FULL)].version == 2


@pytest.mark.parametrize("header", [
    {"ns": "acme", "c": 0, "loc": 1, "sg": 1, "dg": 1, "n": 8},  # no page key
    {"k": b"k" * 32, "ns": "acme", "c": 0, "loc": 1, "sg": 1, "dg": 1, "n": "8"},  # a str size
    {"k": b"k" * 32, "ns": "acme", "c": 99, "loc": 1, "sg": 1, "dg": 1, "n": 8},  # no codec
    {"k": "k", "ns": 7, "c": 0, "loc": 1, "sg": 1, "dg": [], "n": 8},  # wrong types
    {"k": b"k" * 32, "ns": "acme", "c": 0, "loc": 1, "sg": 1, "dg": 1, "n": 8, "sx": 1},
])
def test_a_record_whose_header_is_no_index_entry_leaves_at_a_rebuild(service, header):
    """A version-1 header is plaintext msgpack: a damaged one is dropped when a restarted
    actor rebuilds its index (as a record that does not parse is), and the records around
    it are still found; it must not stop the pool actor from starting."""
    hbm, pool, front, _ = service
    actor = pool.target
    good = b"G" * 32
    data = _page(front, 6)
    pool.store_from(_meta(good), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    packed = msgpack.packb(header)
    bad = b"AKVR" + struct.pack(">I", len(packed)) + packed + bytes(64)
    slot = actor.host.alloc()
    actor.host.write(slot, bad)
    actor.nvme.put(b"b" * 33, bad, 1)
    actor._index.clear()
    actor._rebuild()
    assert list(actor._index) == [(good, Codec.FULL)]
    assert actor.nvme.locate(b"b" * 33)[0] is Lookup.MISS  # it can never be served
    assert slot not in [s for s, _v, _n in actor.host.slots()]
    assert _restored(hbm, pool, good, Tier.HOST) == data


def test_republish_skips_a_legacy_copy_whose_tenant_keys_are_gone(service, tmp_path):
    """A restarted pool adopts a version-1 record of a tenant whose keys were shredded
    (its header is plaintext), but that copy has no directory namespace any more: the
    republish after a Redis loss must skip it, not fail and leave every other copy out."""
    _hbm, pool, front, _ = service
    actor = pool.target
    ensure_tenant(str(tmp_path / "keys"), "ghost")
    good, ghost = b"G" * 32, b"g" * 32
    pool.store_from(_meta(good), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    copy = StoredCopy(tier=Tier.NVME, slot=-1, loc=77, dir_gen=1, nbytes=PAGE,
                      seal_gen=actor.keyring.current_generation("ghost"), namespace="ghost",
                      full=PAGE, state_type="evidence")
    record = build_record_v1(actor.sealer, ghost, Codec.FULL, copy, ghost[::-1],
                             _page(front, 7))
    actor.nvme.put(copy.nkey, record, 1)
    actor.keyring.destroy_tenant("ghost")
    actor._index.clear()
    actor._rebuild()  # a restarted actor: the legacy record is adopted, its keys are gone
    assert (ghost, Codec.FULL) in actor._index
    ns = actor.blinder.namespace("acme")
    actor.directory.delete(ns, good)  # Redis came back empty
    assert actor.directory.get(ns, good)[0] is Lookup.MISS
    assert pool.republish() == 1
    assert actor.directory.get(ns, good)[0] is Lookup.HIT
    assert actor.reset() == 2  # a new controller takes over: that copy goes too, no error
    assert actor.directory.get(ns, good)[0] is Lookup.MISS and not actor._index


def test_republish_does_not_resurrect_a_page_deleted_meanwhile(service):
    """A page deleted (or its tenant erased) while a republish runs: the republish read the
    index before, so it writes the page's entry back after the delete dropped it; that
    entry must be dropped again, not left naming a copy that is gone."""
    _hbm, pool, front, _ = service
    actor = pool.target
    kept, doomed = b"K" * 32, b"D" * 32
    for key in (kept, doomed):
        pool.store_from(_meta(key), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    ns = actor.blinder.namespace("acme")
    inner = actor.directory

    class DeleteFirst:  # the delete lands between the republish's snapshot and its write
        def __getattr__(self, name):
            return getattr(inner, name)

        def restore(self, entries):
            assert pool.delete(doomed, "acme") == 1
            return inner.restore(entries)

    actor.directory = actor.publisher.directory = DeleteFirst()  # the publisher writes
    assert pool.republish() == 1
    assert inner.get(ns, kept)[0] is Lookup.HIT
    assert inner.get(ns, doomed)[0] is Lookup.MISS
