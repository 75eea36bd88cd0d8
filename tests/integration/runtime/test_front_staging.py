"""Staging slots taken for a store or a load are all given back when taking one of them
timed out: the slots taken before it were kept for good, so each timeout under overload
shrank the front's staging until every store and load failed (found by review). A real
front (local service)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.handles import ActorGone, ActorSlow
from agentkv_cluster.runtime.mover import StagingFull
from tests.integration.runtime.test_public_mark import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def test_slots_taken_before_a_timeout_are_given_back() -> None:
    with local_service("agentkv-staging-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=4 * PAGE) as service:
        front = service.front
        mover = front.mover
        free = len(mover._free)
        real, calls = mover.take_slot, []

        def take_slot(timeout_s: float = 10.0) -> int:
            calls.append(timeout_s)
            if len(calls) == 3:
                raise StagingFull("no staging slot free")
            return real(timeout_s)

        mover.take_slot = take_slot
        try:
            with pytest.raises(StagingFull), front._staged(4):
                pass
        finally:
            del mover.take_slot
        assert len(calls) == 3 and len(mover._free) == free


def test_slots_are_held_only_while_an_actor_may_still_move_bytes_through_them(monkeypatch):
    """Slots lent to a call that went unanswered (``ActorSlow``) are held past their lease;
    after an actor's death they come back at once (holding them would starve the front
    for minutes after every HBM actor death), unless the controller itself is gone: an
    HBM actor it asked to pull from them may still do so."""
    with local_service("agentkv-staging-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=4 * PAGE) as service:
        front, mover = service.front, service.front.mover
        free = len(mover._free)
        with pytest.raises(ActorGone), front._staged(4):
            raise ActorGone("hbm-0: RayActorError")  # a death, the controller alive
        assert mover.held_slots() == 0 and len(mover._free) == free
        with pytest.raises(ActorSlow), front._staged(4):
            raise ActorSlow("controller: no answer in 120.0 s")
        assert mover.held_slots() == 4 and len(mover._free) == free - 4

        def gone() -> str:
            raise ActorGone("controller: RayActorError")

        monkeypatch.setattr(front.controller.target, "ping", gone)
        with pytest.raises(ActorGone), front._staged(2):
            raise ActorGone("controller: RayActorError")
        assert mover.held_slots() == 6
