"""An arena page the HBM actor is reading or writing is not given to another page under
the transfer (real NIXL, real /dev/shm; the actors in this process).

A serve pushes resident pages to the front, a demotion encodes one for the pool; both
looked the page up and then read it without holding it. A drop meanwhile (an erasure, a
revoked pin, a reset) freed the page, the next page ingested took it, and the read went
on over the new page's bytes: the serve handed them to the loading engine, the demotion
sealed them as the old page's copy; an ingest's pull, likewise, wrote into the next
page's. Transfers now pin their pages (``ArenaPages``); a page released meanwhile is freed
(zeroed, if an erasure asked for it) when they end, or held past the lease when the
transfer may still run. Each test runs the drop and the ingest at the moment the transfer
begins, on an arena where its page is the only one they can take."""

from __future__ import annotations

import time

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import arena_pages, hbm_actor, mover
from agentkv_cluster.runtime.handles import ActorSlow
from agentkv_cluster.runtime.records import PageMeta
from store.hbm import ArenaFull
from store.transport.base import TransferTimeout
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
                        front_bytes=PAGE, front_slots=2) as (topo, front):
        hbm, pool = topo.hbms["node0-hbm0"], topo.pools["node0"]
        hbm.add_pool("node0", pool)
        hbm.reserve(64, "someone")
        for key, seed in ((A, 1), (B, 2)):
            front.slot_view(0, PAGE)[:] = _page(seed)
            hbm.ingest(key, front.slot_span(0, PAGE))
        yield hbm, pool, front


def _meanwhile(hbm, front, key: bytes = A, slot: int = 0) -> list[str]:
    """What another thread does while ``key``'s page is moved: drop it, ingest c (c's
    bytes staged in the front's ``slot`` first). Returns what happened to c."""
    happened = []
    front.slot_view(slot, PAGE)[:] = _page(3)
    hbm.drop(key)
    try:
        hbm.ingest(C, front.slot_span(slot, PAGE))
        happened.append("ingested")
    except ArenaFull:  # the page is still being moved: not free yet
        happened.append("arena full")
    front.slot_view(slot, PAGE)[:] = 0
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


def test_an_erasure_zeroes_a_page_dropped_unzeroed_while_it_was_served(full, monkeypatch):
    """A page dropped (not zeroed) while served, then its tenant erased: the erasure's
    purge cannot zero it while the push reads it, so it is zeroed as the push ends."""
    hbm, _, front = full
    actor = hbm.target
    push = actor.mover.push_async

    def push_async(*args):
        hbm.drop(A)  # a retirement: no zeroing
        hbm.purge([])  # the tenant's erasure, a's page no longer among its pages
        return push(*args)

    monkeypatch.setattr(actor.mover, "push_async", push_async)
    hbm.serve([A], [front.slot_span(0, PAGE)])
    assert front.slot_view(0, PAGE).tobytes() == _page(1).tobytes()
    assert hbm.arena_holds([_page(1).tobytes()[:4096]]) == [False]


def test_a_page_dropped_while_its_bytes_arrive_is_not_given_to_another(full, monkeypatch):
    hbm, _, front = full
    actor = hbm.target
    hbm.drop(B)  # one free page: the one x's ingest takes
    pull, happened, first = actor.mover.pull, [], [True]

    def pull_meanwhile(*args):  # the ingest has its page: the drop comes now
        if first.pop() if first else False:
            happened.extend(_meanwhile(hbm, front, key=b"x" * 32, slot=1))
        return pull(*args)

    monkeypatch.setattr(actor.mover, "pull", pull_meanwhile)
    front.slot_view(0, PAGE)[:] = _page(4)
    hbm.ingest(b"x" * 32, front.slot_span(0, PAGE))
    monkeypatch.undo()
    assert happened == ["arena full"]
    front.slot_view(1, PAGE)[:] = _page(3)
    hbm.ingest(C, front.slot_span(1, PAGE))  # x's page was freed as its pull ended
    assert hbm.read(C)[:PAGE] == _page(3).tobytes()
    resident = hbm.keys()
    assert b"x" * 32 not in resident


def test_pages_of_a_push_that_did_not_end_stay_pinned_past_the_grace(full, monkeypatch):
    """NIXL may still read pages whose push timed out: a drop of one frees it only after
    ``LEASE_GRACE_S``, and the serve answers ``TransferStalled``, an ``ActorSlow``: the
    front holds its slots the same way."""
    hbm, _, front = full
    actor = hbm.target
    monkeypatch.setattr(mover, "LEASE_GRACE_S", 1.5)
    monkeypatch.setattr(arena_pages, "ALLOC_WAIT_S", 0.3)
    wait = actor.mover.transport.wait

    def wait_then_time_out(job_id, timeout_s=30.0):
        wait(job_id, timeout_s)  # ended, in truth: this one is made to look stalled
        raise TransferTimeout(f"job {job_id} not finished after {timeout_s} s")

    monkeypatch.setattr(actor.mover.transport, "wait", wait_then_time_out)
    with pytest.raises(ActorSlow):
        hbm.serve([A], [front.slot_span(0, PAGE)])
    monkeypatch.setattr(actor.mover.transport, "wait", wait)
    assert hbm.stats()["held_pages"] == 1
    hbm.drop(A)
    front.slot_view(1, PAGE)[:] = _page(3)
    with pytest.raises(ArenaFull):  # a's page is still pinned
        hbm.ingest(C, front.slot_span(1, PAGE))
    time.sleep(1.3)
    hbm.ingest(C, front.slot_span(1, PAGE))  # the pins went: a's page was freed
    assert hbm.stats()["held_pages"] == 0
    assert hbm.read(C)[:PAGE] == _page(3).tobytes()
