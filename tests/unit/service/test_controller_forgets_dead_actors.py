"""The controller actor forgets a dead actor's handle, not only its pages (in this process:
local handles stand in for the actors, no Ray): an HBM actor that died is out of the
topology, so a tenant erasure asks the live HBM actors only and does not fail on the dead
one; a pool whose ping says it died leaves the topology within a few sweeps."""

from __future__ import annotations

import time

from agentkv_cluster.runtime.controller_actor import ControllerActor, ControllerSpec
from agentkv_cluster.runtime.erasure_receipts import HbmPurged
from agentkv_cluster.runtime.handles import ActorGone, HbmHandle, PoolHandle
from tests.unit.service.test_controller import MB


class _Actor:
    """An HBM actor or a pool: answers, or fails every call as a dead Ray actor's would."""

    def __init__(self, dead: bool = False) -> None:
        self.dead, self.purged = dead, 0

    def ping(self) -> str:
        if self.dead:
            raise ActorGone("RayActorError")
        return "here"

    def purge(self, keys: list[bytes]) -> HbmPurged:
        if self.dead:
            raise ActorGone("RayActorError")
        self.purged += 1
        return HbmPurged(pages=len(keys), free_zeroed=0, staging_zeroed=0)


def test_an_erasure_after_an_hbm_actor_died_asks_the_live_ones_only() -> None:
    actor = ControllerActor(ControllerSpec(idle_session_s=0))
    try:
        live, dead = _Actor(), _Actor()
        actor.add_hbm("h0", HbmHandle.local(live, "h0"), 8 * MB, "p0")
        actor.add_hbm("h1", HbmHandle.local(dead, "h1"), 8 * MB, "p0")
        dead.dead = True
        actor.remove_hbm("h1")
        assert actor.topology()["hbms"] == ["h0"]
        erased = actor.erase_tenant("t")
        assert erased.hbm_actors == 1 and live.purged == 1
    finally:
        actor.close()


def test_a_dead_pool_leaves_the_topology() -> None:
    actor = ControllerActor(ControllerSpec(idle_session_s=0))
    try:
        actor.add_pool("p0", PoolHandle.local(_Actor(), "p0"))
        actor.add_pool("p1", PoolHandle.local(_Actor(dead=True), "p1"))
        deadline = time.monotonic() + 10.0
        while actor.topology()["pools"] != ["p0"]:
            assert time.monotonic() < deadline, actor.topology()
            time.sleep(0.05)
    finally:
        actor.close()
