"""The ``structured`` mark (a page that feeds code or JSON output: the risk controller keeps
it exact) travels with the page's pool copies (real NIXL, /dev/shm, NVMe files, AES-GCM; no
Ray). It is sealed in each copy's index entry and survives an index rebuild, and a session
that adopts the page through the directory (a prefix lookup finding it on a pool: stored
from another node, or before a restart) marks its record. Before, the adopted record
started unmarked, so pressure could demote the page lossy."""

from __future__ import annotations

import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.records import PageMeta
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
STRUCTURED, PLAIN, MARKED_LATER = b"S" * 32, b"P" * 32, b"L" * 32


@pytest.fixture
def stored(tmp_path):
    """A topology whose pool holds STRUCTURED (host, marked), PLAIN (NVMe, unmarked) and
    MARKED_LATER (an unmarked FULL copy on NVMe, then a marked INT8 one on the host)."""
    with local_topology(tmp_path, hbm_page=MIB, hbm_pages=4, pool_bytes=8 * MIB,
                        front_bytes=MIB, front_slots=1) as (topo, front):
        pool = topo.pools["node0"]
        front.slot_view(0, MIB)[:] = 7
        for key, structured, tier, codec in (
                (STRUCTURED, True, Tier.HOST, Codec.FULL), (PLAIN, False, Tier.NVME, Codec.FULL),
                (MARKED_LATER, False, Tier.NVME, Codec.FULL),
                (MARKED_LATER, True, Tier.HOST, Codec.INT8)):
            pool.store_from(_meta(key, structured=structured), tier, codec,
                            front.slot_span(0, MIB))
        yield topo


def _meta(key: bytes, *, structured: bool = False, page_id: int = 0) -> PageMeta:
    return PageMeta(key=key, digest=key[::-1], tenant="acme", namespace="acme", session="s",
                    page_id=page_id, state_type=StateType.EVIDENCE, length=MIB, tokens=1,
                    structured=structured)


def _marks(pool) -> list[bool]:
    return [h.structured for h in pool.holds_many([STRUCTURED, PLAIN, MARKED_LATER])]


def test_the_mark_is_sealed_with_each_copy_and_read_back_after_a_rebuild(stored) -> None:
    pool = stored.pools["node0"]
    assert _marks(pool) == [True, False, True]  # any copy stored marked marks the page
    actor = pool.target
    assert not actor._index[(MARKED_LATER, Codec.FULL)].structured
    actor._index.clear()  # a restarted actor: the index comes back from the records alone
    actor._rebuild()
    assert _marks(pool) == [True, False, True]
    assert (actor._index[(STRUCTURED, Codec.FULL)].tier, actor._index[(PLAIN, Codec.FULL)].tier
            ) == (Tier.HOST, Tier.NVME)  # read back from both tiers


def test_a_page_adopted_through_the_directory_keeps_its_mark(stored) -> None:
    controller = stored.controller
    controller.open_session("acme", "q")
    ns = stored.pools["node0"].target.blinder.namespace("acme")
    metas = [_meta(k, page_id=i) for i, k in enumerate((STRUCTURED, PLAIN, MARKED_LATER))]
    assert controller.lookup("acme", "q", metas, [ns] * 3) == 3  # all adopted from the pool
    table = controller.target.controller.table
    marks = {r.meta.key: (r.meta.structured, r.view.produces_structured)
             for r in table.pages.values()}
    assert marks == {STRUCTURED: (True, True), PLAIN: (False, False),
                     MARKED_LATER: (True, True)}
