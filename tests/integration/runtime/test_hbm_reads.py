"""An arena page the HBM actor is reading is not freed under the read (real NIXL, real
/dev/shm; the actors in this process).

A serve pushes resident pages to the front, a demotion encodes one for the pool; both
looked the page up and then read it without holding it. A drop meanwhile (an erasure, a
revoked pin, a reset) freed the page, the next page ingested took it, and the read went
on over the new page's bytes: the serve handed them to the loading engine, the demotion
sealed them as the old page's copy. Reads now pin their pages; a page released while
read is freed when its reads end. Each test runs the drop and the ingest at the moment
the read begins, on an arena where the read page is the only one they can take."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import hbm_actor
from agentkv_cluster.runtime.records import PageMeta
from store.hbm import ArenaFull
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
PAGE = 1 << 20
A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def _page(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)


@pytest.fixture
def full(tmp_path):
    """Two arena pages holding a and b, every landing page reserved: a freed page is the
    only one a new page can get."""
    with local_topology(tmp_path, hbm_page=PAGE, hbm_pages=2, pool_bytes=8 * PAGE,
                        front_bytes=PAGE, front_slots=1) as (topo, front):
        hbm, pool = topo.hbms["node0-hbm0"], topo.pools["node0"]
        hbm.add_pool("node0", pool)
        hbm.reserve(64, "someone")
        for key, seed in ((A, 1), (B, 2)):
            front.slot_view(0, PAGE)[:] = _page(seed)
            hbm.ingest(key, front.slot_span(0, PAGE))
        yield hbm, pool, front


def _meanwhile(hbm, front) -> list[str]:
    """What another thread does while a's page is read: drop a, ingest c (c's bytes
    staged in the front's slot first). Returns what happened to c."""
    happened = []
    front.slot_view(0, PAGE)[:] = _page(3)
    hbm.drop(A)
    try:
        hbm.ingest(C, front.slot_span(0, PAGE))
        happened.append("ingested")
    except ArenaFull:  # a's page is still being read: not free yet
        happened.append("arena full")
    front.slot_view(0, PAGE)[:] = 0
    return happened


def test_a_page_dropped_while_served_keeps_its_bytes_until_the_push_ends(full, monkeypatch):
    hbm, _, front = full
    actor = hbm.target
    push, happened = actor.mover.push_async, []

    def push_async(*args):  # the serve has looked the page up: the drop comes now
        happened.extend(_meanwhile(hbm, front))
        return push(*args)

    monkeypatch.setattr(actor.mover, "push_async", push_async)
    hbm.serve([A], [front.slot_span(0, PAGE)])
    monkeypatch.undo()
    assert front.slot_view(0, PAGE).tobytes() == _page(1).tobytes()  # a's, not c's
    assert happened == ["arena full"]
    front.slot_view(0, PAGE)[:] = _page(3)
    hbm.ingest(C, front.slot_span(0, PAGE))  # a's page was freed as the serve ended
    assert hbm.read(C)[:PAGE] == _page(3).tobytes()


def test_a_page_dropped_while_demoted_is_sealed_with_its_own_bytes(full, monkeypatch):
    hbm, pool, front = full
    encode, happened = hbm_actor.encode_page, []

    def encode_page(*args):  # the demotion has looked the page up: the drop comes now
        happened.extend(_meanwhile(hbm, front))
        return encode(*args)

    monkeypatch.setattr(hbm_actor, "encode_page", encode_page)
    meta = PageMeta(key=A, digest=b"d" * 32, tenant="acme", namespace="acme", session="s",
                    page_id=0, state_type=StateType.EVIDENCE, length=PAGE, tokens=1)
    hbm.demote(meta, [(int(Tier.HOST), int(Codec.FULL))], "node0", False)
    monkeypatch.undo()
    pool.restore_to(A, meta.digest, int(Codec.FULL), front.slot_span(0, PAGE).wire())
    assert front.slot_view(0, PAGE).tobytes() == _page(1).tobytes()  # a's, not c's
    assert happened == ["arena full"]
