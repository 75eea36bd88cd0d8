"""One-hop restores into landing pages (real NIXL, real /dev/shm, real AES-GCM; the actors
in this process): a FULL copy lands byte-identical in a reserved arena page, compressed
copies still go through the HBM actor, a failed push leaves no page behind, and only the
executor that reserved a page can land it or give it back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.landing import LandingPages
from agentkv_cluster.runtime.mover import Mover
from agentkv_cluster.runtime.pool_actor import PageMissing
from agentkv_cluster.runtime.records import DemoteReceipt, KvShape, PageMeta, UnknownPageKey
from store.hbm import PageTooLarge
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
PAGE = 3 * MIB + 17  # two sealed chunks


@pytest.fixture
def service(tmp_path):
    with local_topology(tmp_path, hbm_page=4 * MIB, hbm_pages=2, pool_bytes=16 * MIB,
                        front_bytes=PAGE, front_slots=1) as (topo, front):
        pool = topo.pools["node0"]
        topo.hbms["node0-hbm0"].add_pool("node0", pool)  # as the executor does: moves name it
        yield topo.hbms["node0-hbm0"], pool, front


def _meta(key: bytes = b"k" * 32) -> PageMeta:
    return PageMeta(key=key, digest=b"d" * 32, tenant="acme", namespace="acme", session="s",
                    page_id=0, state_type=StateType.EVIDENCE, length=PAGE, tokens=1)


def _stored(pool, front: Mover, codec: Codec = Codec.FULL) -> bytes:
    data = np.random.default_rng(3).integers(0, 256, PAGE, dtype=np.uint8)
    front.slot_view(0, PAGE)[:] = data
    pool.store_from(_meta(), Tier.HOST, codec, front.slot_span(0, PAGE))
    return data.tobytes()


def test_full_copy_lands_in_a_reserved_page_byte_identical(service):
    hbm, pool, front = service
    page = _stored(pool, front)
    landing = LandingPages("exec-a", per_hbm=2)
    # The first restore finds no stock (it is reserved in the background) and goes via the
    # HBM actor; the next one lands straight in a reserved page.
    for expected_one_hop in (0, 1):
        receipt = landing.restore("h", hbm, pool, "node0", _meta(), int(Tier.HOST),
                                  int(Codec.FULL))
        assert (receipt.tier, receipt.link_bytes, receipt.exact) == (int(Tier.HOST), PAGE, True)
        assert hbm.read(b"k" * 32)[:PAGE] == page
        assert landing.one_hop == expected_one_hop
        hbm.drop(b"k" * 32)
    assert (landing.one_hop, landing.two_hop) == (1, 1)
    assert hbm.stats()["landing_pages"] == 2  # refilled after the landing
    landing.release()
    assert hbm.stats()["landing_pages"] == 0 and hbm.stats()["used_pages"] == 0


def test_compressed_copy_goes_through_the_hbm_actor(service):
    hbm, _pool, front = service
    shape = KvShape(layers=2, kv_heads=4, tokens=64, head_dim=64)
    meta = replace(_meta(), length=shape.nbytes(), shape=shape)
    kv = np.random.default_rng(5).standard_normal(shape.nbytes() // 2).astype(np.float16)
    front.slot_view(0, meta.length)[:] = kv.view(np.uint8)
    wiring.introduce(hbm, front)
    hbm.ingest(meta.key, front.slot_span(0, meta.length))
    hbm.demote(meta, [(int(Tier.HOST), int(Codec.INT8))], "node0", True)
    landing = LandingPages("exec-a", per_hbm=2)
    receipt = landing.restore("h", hbm, _pool, "node0", meta, int(Tier.HOST), int(Codec.INT8))
    assert receipt.exact is False and receipt.link_bytes < meta.length * 0.6  # INT8 + scales
    assert (landing.one_hop, landing.two_hop) == (0, 1)
    assert hbm.stats()["landing_pages"] == 0  # compressed restores never take stock
    back = np.frombuffer(hbm.read(meta.key)[:meta.length], np.float16).astype(np.float32)
    assert np.abs(back - kv.astype(np.float32)).max() < 0.1  # INT8 of N(0,1): close, lossy


def test_a_page_the_lossy_codec_cannot_encode_is_demoted_full(service):
    """INT8 and INT4 keep fp16 scales: a page holding inf (or values beyond fp16 range)
    has no lossy form. Its demotion failed, so a gap migration of it never happened and
    it stayed in HBM; now its copy is FULL (the receipt says so) and comes back exact."""
    hbm, _pool, front = service
    shape = KvShape(layers=2, kv_heads=4, tokens=64, head_dim=64)
    meta = replace(_meta(), length=shape.nbytes(), shape=shape)
    kv = np.random.default_rng(6).standard_normal(shape.nbytes() // 2).astype(np.float16)
    kv[5] = np.inf
    front.slot_view(0, meta.length)[:] = kv.view(np.uint8)
    wiring.introduce(hbm, front)
    hbm.ingest(meta.key, front.slot_span(0, meta.length))
    receipt = hbm.demote(meta, [(int(Tier.HOST), int(Codec.INT4)),
                                (int(Tier.NVME), int(Codec.FULL))], "node0", False)
    assert isinstance(receipt, DemoteReceipt)
    # One FULL copy holds it all: a second (the reference) would replace it in the pool
    # while the manager counted both.
    assert receipt.copies == ((int(Tier.HOST), int(Codec.FULL)),)
    assert receipt.tier_bytes == (meta.length,)
    hbm.drop(meta.key)
    hbm.restore(meta, int(Tier.HOST), int(Codec.FULL), "node0")
    assert hbm.read(meta.key)[:meta.length] == kv.tobytes()


def test_failed_push_leaves_no_page_and_keeps_the_stock_bounded(service):
    hbm, pool, front = service
    _stored(pool, front)
    landing = LandingPages("exec-a", per_hbm=2)
    landing.restore("h", hbm, pool, "node0", _meta(), int(Tier.HOST), int(Codec.FULL))
    hbm.drop(b"k" * 32)
    for _ in range(3):  # no copy of this key: the push fails after the page was landed
        with pytest.raises(PageMissing):
            landing.restore("h", hbm, pool, "node0", _meta(b"x" * 32), int(Tier.HOST),
                            int(Codec.FULL))
    resident = hbm.keys()
    assert b"x" * 32 not in resident
    stats = hbm.stats()
    assert stats["pages"] == 0 and stats["used_pages"] == stats["landing_pages"] <= 2
    landing.release()
    assert hbm.stats()["used_pages"] == 0


def test_only_the_owner_lands_or_returns_a_reserved_page(service):
    hbm, _pool, _front = service
    target = hbm.target
    got = target.reserve(10, "exec-a")
    assert len(got) == target.spec.landing_pages  # capped, beyond the budgeted pages
    assert target.stats()["capacity_bytes"] == 2 * 4 * MIB  # landing pages are not budget
    page = got[0][0]
    with pytest.raises(UnknownPageKey):
        target.land(b"k" * 32, page, PAGE, "exec-b")
    assert target.release_landing([page], "exec-b") == 0
    assert target.release_landing([page], "exec-a") == 1
    with pytest.raises(UnknownPageKey):  # given back: no longer landable
        target.land(b"k" * 32, page, PAGE, "exec-a")
    target.land(b"k" * 32, got[1][0], PAGE, "exec-a")
    assert target.keys() == [b"k" * 32]
    assert target.reset() == 1
    # The six pages still reserved are held, not freed: the old executor's pools may still
    # push into them for as long as its calls could wait (ArenaPages.reset).
    stats = target.stats()
    assert stats["landing_pages"] == 0 and stats["pages"] == 0
    assert stats["used_pages"] == stats["held_pages"] == target.spec.landing_pages - 2


def test_a_page_larger_than_an_arena_page_is_refused_before_any_push(service):
    hbm, pool, front = service
    _stored(pool, front)
    landing = LandingPages("exec-a", per_hbm=2)
    big = replace(_meta(), length=4 * MIB + 1)
    for expected in ((0, 1), (0, 1)):  # via the HBM actor, then with a landing page in stock
        with pytest.raises(PageTooLarge):
            landing.restore("h", hbm, pool, "node0", big, int(Tier.HOST), int(Codec.FULL))
        assert (landing.one_hop, landing.two_hop) == expected
    stats = hbm.stats()
    assert stats["pages"] == 0 and stats["used_pages"] == stats["landing_pages"]  # no leak



def test_a_landed_or_returned_page_keeps_nothing_of_what_it_held_before(service):
    hbm, pool, front = service
    target = hbm.target
    page = _stored(pool, front)  # 3 MiB + 17 B: the push covers most of a 4 MiB page
    landing = LandingPages("exec-a", per_hbm=2)
    landing.restore("h", hbm, pool, "node0", _meta(), int(Tier.HOST), int(Codec.FULL))
    hbm.drop(b"k" * 32)  # restored via the HBM actor, which stocked two landing pages
    old = b"bytes of a page dropped before this one was reserved"
    for reserved in list(target.pages._landing):  # reserving does not zero a page
        view = target.arena.view(reserved).numpy()
        view[:] = np.resize(np.frombuffer(old, np.uint8), view.shape)
    landing.restore("h", hbm, pool, "node0", _meta(), int(Tier.HOST), int(Codec.FULL))
    assert landing.one_hop == 1
    view = target.arena.view(target.pages._pages[b"k" * 32]).numpy()
    assert view[:PAGE].tobytes() == page and not view[PAGE:].any()  # zeroed past the push
    assert target.arena_holds([old]) == [True]  # in the page still in stock
    assert landing.release() >= 1
    assert target.arena_holds([old]) == [False]  # given back zeroed
