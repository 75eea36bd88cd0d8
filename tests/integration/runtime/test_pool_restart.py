"""A pool actor restarted over its old host segment (the actor died, the segment stays):
what a store the old actor left unfinished is reclaimed, not kept for good (found by
review). A real pool in this process: /dev/shm, NVMe files, AES-GCM, NIXL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.pool_actor import PoolActor
from store.directory import EmbeddedDirectory
from store.host_pool import PAGE_BYTES
from store.types import Codec
from tests.support.pool_pages import front_mover, pool_spec, store_page

pytestmark = pytest.mark.integration


class _Died(BaseException):
    """The actor process ends here."""


@pytest.fixture
def spec(tmp_path):
    spec = pool_spec(tmp_path)
    yield spec
    from store.host_pool import HostPool

    try:
        HostPool.attach(spec.shm_name).unlink()
    except FileNotFoundError:
        pass


def _start(spec) -> tuple[PoolActor, object]:
    actor = PoolActor(spec, EmbeddedDirectory())
    front = front_mover()
    wiring.introduce(actor, front)
    return actor, front


def _stop(actor: PoolActor, front) -> None:
    actor.close(unlink=False)  # as a killed actor: the segment stays for the next one
    front.close()


def test_a_slot_a_dead_actor_was_storing_into_is_freed_on_restart(spec) -> None:
    actor, front = _start(spec)
    store_page(actor, front, 1)
    slot = actor.host.alloc()  # a store that allocated and reserved, then the actor died
    actor.host.reserve(slot, 4096)
    _stop(actor, front)
    actor, front = _start(spec)
    try:
        assert actor.host.stats().used_slots == 1  # the page's slot only
        assert list(actor.host.slots(empty=True)) == []
    finally:
        _stop(actor, front)


def test_two_copies_a_dead_actor_left_of_one_page_become_one(spec) -> None:
    actor, front = _start(spec)
    key = store_page(actor, front, 1)

    def died(old, new) -> bool:  # between the new copy's commit and the old one's release
        raise _Died

    actor.tiers.replaced = died
    with pytest.raises(_Died):
        store_page(actor, front, 1)  # stored again (a restore, then a new demotion)
    assert actor.host.stats().used_slots == 2
    _stop(actor, front)
    actor, front = _start(spec)
    try:
        assert actor.host.stats().used_slots == 1  # one copy kept, the other released
        assert actor.holds_many([key])[0] is not None
        assert actor.delete(key, "acme") == 1
        assert actor.host.stats().used_slots == 0
    finally:
        _stop(actor, front)
    actor, front = _start(spec)
    try:  # deleted, it stays deleted
        assert actor.holds_many([key]) == [None] and actor.host.stats().used_slots == 0
        assert (key, Codec.FULL) not in actor._index
    finally:
        _stop(actor, front)


def test_a_segment_of_another_geometry_is_replaced(spec) -> None:
    actor, front = _start(spec)
    store_page(actor, front, 1)
    before = actor.host.slot_bytes
    _stop(actor, front)
    bigger = replace(spec, host_slot_bytes=2 * spec.host_slot_bytes)  # pool.slot_bytes raised
    actor, front = _start(bigger)
    try:
        assert actor.host.slot_bytes >= 2 * before - PAGE_BYTES  # not the old, smaller slots
        assert actor.host.stats().used_slots == 0  # its pages went with it (recomputed)
        store_page(actor, front, 2)  # the new segment takes stores
        assert actor.host.stats().used_slots == 1
    finally:
        _stop(actor, front)
