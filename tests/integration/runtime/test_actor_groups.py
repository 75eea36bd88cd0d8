"""An HBM actor whose every thread waits for a free arena page still answers its health
check and still frees pages (real Ray, the service's own actor class and options).

Under a burst (``agentkv demo --sessions 600``) every thread of the HBM actor waited in
``_alloc`` for a page that only a queued ``drop`` would free: the waits gave up with
``ArenaFull``, and the watcher's ping, queued behind them too, timed out, so the
controller forgot a live actor and every later call answered ``KeyError``."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.actor_groups import remote_class
from agentkv_cluster.runtime.hbm_actor import HbmActor, HbmSpec
from agentkv_cluster.runtime.mover import Mover

pytestmark = pytest.mark.integration
THREADS = 8  # the HBM actor's max_concurrency in ``wiring.spawn_hbm``


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_ping_and_drops_pass_allocations_that_wait(ray_local) -> None:
    ray = ray_local
    spec = HbmSpec(name="groups", page_bytes=1 << 16, num_pages=0, landing_pages=2)
    actor = remote_class(HbmActor).options(num_cpus=0, max_concurrency=THREADS).remote(spec)
    assert ray.get(actor.ping.remote(), timeout=120) == "groups"
    taken = ray.get(actor.reserve.remote(2, "holder"))  # the whole arena: the next alloc waits
    assert len(taken) == 2
    # A real source: the ingest that takes the freed page pulls it and keeps the page. (A
    # pull that failed gave the page back at once, the next waiter took it and failed in
    # turn, and whether the driver saw those replies before its check was a race.)
    front = Mover("groups-front", 1 << 16, 1)
    ray.get(actor.introduce.remote(front.endpoint()))
    front.introduce(ray.get(actor.endpoint.remote()))
    src = front.slot_span(front.take_slot(), 1 << 16)
    waiting = [actor.ingest.remote(bytes([i]) * 32, src) for i in range(THREADS)]
    ping = actor.ping.remote()
    freed = actor.release_landing.remote([taken[0][0]], "holder")
    ray.wait([ping, freed], num_returns=2)
    # both answered while the allocations still wait (ALLOC_WAIT_S): at most the one that
    # took the freed page is done. Without their own groups they ran only once a thread
    # came free, after every wait had given up.
    done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
    assert len(done) <= 1
    assert ray.get(freed) == 1
    ray.kill(actor)
    front.close()
