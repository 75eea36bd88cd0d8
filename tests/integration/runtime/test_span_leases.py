"""Memory lent to a call that went unanswered is not reused while a late peer may still
move bytes through it (real NIXL, real /dev/shm, real AES-GCM; the actors in this process).

A call past its timeout raises ``ActorSlow`` while the actor behind it may be alive and
busy, and may still push into, or pull from, the spans it was given. Before leases, the
caller gave that memory back at once: a late push landed in whatever page or staging slot
got it next (another request's, another tenant's), and a late pull read it. Now every span
lent to such a call carries a lease (``RemoteSpan.expires``): no transfer starts on it
after the lease, and memory whose call went unanswered stays out of use until
``LEASE_GRACE_S`` past it, then comes back zeroed.

``LatePool`` is the real pool answering after its caller gave up: each ``restore_to``
raises ``ActorSlow`` at once, as a Ray call past its timeout does, and runs ``after``
seconds later on a thread of its own."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime import mover
from agentkv_cluster.runtime.handles import ActorSlow, PoolHandle
from agentkv_cluster.runtime.landing import LandingPages
from agentkv_cluster.runtime.mover import MoveError, Mover, SpanExpired, lease_end
from agentkv_cluster.runtime.records import PageMeta
from store.hbm import ArenaFull
from store.transport.base import TransferTimeout
from store.types import Codec, Tier
from tests.support.local_topology import local_topology

pytestmark = pytest.mark.integration
MIB = 1 << 20
PAGE = MIB


class LatePool:
    """The real pool (its local handle), answering every ``restore_to`` too late."""

    def __init__(self, pool: PoolHandle, after: float) -> None:
        self.pool, self.after = pool, after
        self.results: list[object] = []
        self._threads: list[threading.Thread] = []

    def restore_to(self, key: bytes, digest: bytes, codec: int, dst: tuple) -> tuple:
        def late() -> None:
            time.sleep(self.after)
            try:
                self.results.append(self.pool.restore_to(key, digest, codec, dst))
            except Exception as exc:  # noqa: BLE001 - what the late push met, for the test
                self.results.append(exc)

        thread = threading.Thread(target=late)
        thread.start()
        self._threads.append(thread)
        raise ActorSlow("late-pool: no answer in time")

    def finish(self) -> list[object]:
        for thread in self._threads:
            thread.join()
        return self.results


def _meta(key: bytes) -> PageMeta:
    return PageMeta(key=key, digest=b"d" * 32, tenant="acme", namespace="acme", session="s",
                    page_id=0, state_type=StateType.EVIDENCE, length=PAGE, tokens=1)


def _page(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8)


@pytest.fixture
def full(tmp_path):
    """An HBM actor of two pages, its landing pages reserved by someone else, one page
    resident; the pool holds a FULL copy of page ``r``; a front slot to stage pages."""
    with local_topology(tmp_path, hbm_page=PAGE, hbm_pages=2, pool_bytes=8 * PAGE,
                        front_bytes=PAGE, front_slots=1) as (topo, front):
        hbm, pool = topo.hbms["node0-hbm0"], topo.pools["node0"]
        hbm.add_pool("node0", pool)  # as the executor does: moves name it
        hbm.reserve(64, "someone")
        front.slot_view(0, PAGE)[:] = _page(1)
        hbm.ingest(b"a" * 32, front.slot_span(0, PAGE))
        front.slot_view(0, PAGE)[:] = _page(2)
        pool.store_from(_meta(b"r" * 32), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
        yield hbm, pool, front


def _late(pool: PoolHandle, after: float, timeout_s: float) -> tuple[LatePool, PoolHandle]:
    late = LatePool(pool, after)
    return late, PoolHandle.local(late, "late").options(timeout_s=timeout_s)


def test_a_late_push_never_lands_in_the_next_page(full) -> None:
    """The pool pushes the restored page inside its lease but after the HBM actor gave up
    on it: the arena page stays held, so the page ingested next keeps its own bytes."""
    hbm, pool, front = full
    late, handle = _late(pool, after=0.5, timeout_s=30.0)
    with pytest.raises(ActorSlow):
        hbm.restore(_meta(b"r" * 32), int(Tier.HOST), int(Codec.FULL), handle)
    hbm.drop(b"a" * 32)  # one free page: a's. The restore's page is held, not free
    mine = _page(3)
    front.slot_view(0, PAGE)[:] = mine
    hbm.ingest(b"c" * 32, front.slot_span(0, PAGE))
    (result,) = late.finish()
    assert not isinstance(result, Exception)  # the late push ran, inside its lease
    assert hbm.read(b"c" * 32)[:PAGE] == mine.tobytes()
    assert hbm.stats()["held_pages"] == 1


def test_a_push_after_the_lease_is_refused(full) -> None:
    hbm, pool, _ = full
    late, handle = _late(pool, after=0.6, timeout_s=0.2)
    with pytest.raises(ActorSlow):
        hbm.restore(_meta(b"r" * 32), int(Tier.HOST), int(Codec.FULL), handle)
    (result,) = late.finish()
    assert isinstance(result, SpanExpired)
    assert hbm.arena_holds([_page(2).tobytes()[:4096]]) == [False]  # nothing landed


def test_a_held_page_comes_back_zeroed_after_the_grace(full, monkeypatch) -> None:
    hbm, pool, front = full
    monkeypatch.setattr(mover, "LEASE_GRACE_S", 0.0)  # held until the lease ends
    late, handle = _late(pool, after=0.0, timeout_s=3.0)
    with pytest.raises(ActorSlow):
        hbm.restore(_meta(b"r" * 32), int(Tier.HOST), int(Codec.FULL), handle)
    late.finish()  # landed in the held page
    assert not hbm.hold(b"x" * 32, lease_end(0.0), 0, "nobody")  # no such page: not held
    front.slot_view(0, PAGE)[:] = _page(4)
    with pytest.raises(ArenaFull):  # waits 2 s; the page is held for 3
        hbm.ingest(b"c" * 32, front.slot_span(0, PAGE))
    time.sleep(1.2)
    hbm.ingest(b"c" * 32, front.slot_span(0, PAGE))
    assert hbm.stats()["held_pages"] == 0
    assert hbm.read(b"c" * 32)[:PAGE] == _page(4).tobytes()
    assert hbm.arena_holds([_page(2).tobytes()[:4096]]) == [False]  # zeroed when given back


def test_a_landing_page_whose_push_went_unanswered_is_held(full) -> None:
    """One-hop restores: the landing page the pool may still push into is held, not given
    back to the actor's free pages (nor dropped, which frees it)."""
    hbm, pool, _ = full
    hbm.release_landing(list(range(10)), "someone")
    landing = LandingPages("exec-a", per_hbm=2)
    landing.restore("h", hbm, pool, "node0", _meta(b"r" * 32), int(Tier.HOST),
                    int(Codec.FULL))  # the first goes through the HBM actor and stocks
    late, handle = _late(pool, after=0.3, timeout_s=30.0)
    with pytest.raises(ActorSlow):
        landing.restore("h", hbm, handle, "late", _meta(b"q" * 32), int(Tier.HOST),
                        int(Codec.FULL))
    late.finish()
    after = hbm.stats()
    resident = hbm.keys()
    assert after["held_pages"] == 1 and b"q" * 32 not in resident
    assert after["used_pages"] == after["pages"] + after["landing_pages"] + 1  # still taken


def test_staging_slots_lent_to_an_unanswered_call_are_held(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(mover, "LEASE_GRACE_S", 0.0)  # held until the lease ends
    front = Mover(f"test-lease-{id(tmp_path):x}", 4096, 4)
    try:
        with pytest.raises(MoveError), front.staged(2, lease_end(1.0),
                                                    held_on=mover.unanswered):
            raise MoveError("answered, with an error: the slots come back")
        assert front.held_slots() == 0 and len(front._free) == 4
        with pytest.raises(ActorSlow), front.staged(2, lease_end(1.0),
                                                    held_on=mover.unanswered) as st:
            for slot in st.slots:
                front.slot_view(slot)[:] = 7
            raise ActorSlow("unanswered")
        assert front.held_slots() == 2
        with front.staged(2, 0.0), pytest.raises(mover.StagingFull):  # two others were free
            front.take_slot(timeout_s=0.2)
        front.hold_slot(front.take_slot(), time.time() + 60)
        time.sleep(1.1)
        with front.staged(2, 0.0) as st:  # the two whose lease ended came back, zeroed
            assert all(not front.slot_view(slot).any() for slot in st.slots)
            assert front.held_slots() == 1
    finally:
        front.close()


def test_a_transfer_on_an_expired_span_is_refused(tmp_path) -> None:
    a = Mover(f"test-lease-a-{id(tmp_path):x}", 4096, 1)
    b = Mover(f"test-lease-b-{id(tmp_path):x}", 4096, 1)
    try:
        a.introduce(b.endpoint())
        b.introduce(a.endpoint())
        b.slot_view(0)[:] = 9
        a.pull(b.slot_span(0, 4096, lease_end(5.0)), a.staging_region)  # in its lease
        assert (a.slot_view(0) == 9).all()
        a.slot_view(0)[:] = 1
        for expired in (b.slot_span(0, 4096, time.time() - 1),
                        b.slot_span(0, 4096, time.time() - 1).part(1024, 1024)):
            with pytest.raises(SpanExpired):
                a.push(a.staging_region, 0, expired)
            with pytest.raises(SpanExpired):
                a.pull(expired, a.staging_region)
        assert (b.slot_view(0) == 9).all() and (a.slot_view(0) == 1).all()
    finally:
        a.close()
        b.close()


def test_a_pool_holds_the_slot_a_stalled_pull_may_still_write(full, monkeypatch) -> None:
    """The pool pulls a demoted page into a staging slot of its own: when the pull did not
    end (``TransferStalled``) the slot is held, not given to the next store."""
    _, pool, front = full
    actor = pool.target
    wait = actor.mover.transport.wait

    def wait_then_time_out(job_id, timeout_s=30.0):
        wait(job_id, timeout_s)  # ended, in truth: this one is made to look stalled
        raise TransferTimeout(f"job {job_id} not finished after {timeout_s} s")

    monkeypatch.setattr(actor.mover.transport, "wait", wait_then_time_out)
    free = len(actor.mover._free)
    with pytest.raises(ActorSlow):
        pool.store_from(_meta(b"s" * 32), Tier.HOST, Codec.FULL, front.slot_span(0, PAGE))
    assert actor.mover.held_slots() == 1 and len(actor.mover._free) == free - 1
