"""After Redis restarts empty, each pool's entries are written back once, by the pool.

The head's watch (as ``watch_redis`` builds it for the service) sees the emptied server
and logs it; the pool's repair loop republishes. The entry writes are counted on the
real redis-server by the pool's write count in the namespace (``w:<node>``, one per PUT),
which starts again from zero with the emptied server. A pool restarted from
its records republishes once at start-up, so a later empty restart of Redis is seen and
repaired without the watch.
"""

from __future__ import annotations

import pytest
import redis as redis_py

from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.directory_glue import RedisSpec, open_directory
from agentkv_cluster.runtime.directory_watch import watch_redis
from agentkv_cluster.runtime.mover import Mover
from agentkv_cluster.runtime.pool_actor import PoolActor
from store.directory.redis_backend import RedisDirectory
from store.types import Lookup
from tests.support.pool_pages import front_mover, pool_spec, store_page, wait_until
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
PAGES = 3


@pytest.fixture
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


@pytest.fixture
def spec(tmp_path):
    return pool_spec(tmp_path)


@pytest.fixture
def front():
    mover = front_mover()
    yield mover
    mover.close()


def _open(spec, redis, front: Mover) -> PoolActor:
    actor = PoolActor(spec, open_directory(RedisSpec(url=redis.url)))
    wiring.introduce(actor, front)
    return actor


@pytest.mark.parametrize("first", ["watch", "pool"])
def test_after_an_empty_restart_each_entry_is_written_back_once(spec, redis, front,
                                                                first) -> None:
    actor = _open(spec, redis, front)
    actor.publisher.close()  # the test runs the repair loop's rounds itself
    try:
        keys = [store_page(actor, front, i) for i in range(1, PAGES + 1)]
        watch = watch_redis(RedisSpec(url=redis.url))
        assert watch.probe_once() == watch.interval_s  # up, and the marker is set
        redis.restart()  # no persistence: the server comes back empty
        admin = redis_py.Redis.from_url(redis.url)
        republished: list[int] = []

        def republish() -> int:
            republished.append(actor.republish())
            return republished[-1]

        rounds = [watch.probe_once, lambda: actor.publisher.sync(republish)]
        for step in (rounds if first == "watch" else rounds[::-1]) * 2:
            step()
        ns = actor.blinder.namespace("acme")
        assert republished == [PAGES] and watch.recoveries == 1
        assert int(admin.get(f"akv:{{{ns}}}:w:{actor.name}")) == PAGES  # one PUT per entry
        other = RedisDirectory(redis.url)
        assert all(other.get(ns, k)[0] is Lookup.HIT for k in keys)
        other.close()
        admin.close()
    finally:
        actor.close()


def test_a_restarted_pool_sees_a_later_empty_restart_of_redis(spec, redis, front) -> None:
    actor = _open(spec, redis, front)
    keys = [store_page(actor, front, i) for i in range(1, PAGES + 1)]
    actor.close(unlink=False)
    actor = _open(spec, redis, front)  # adopts its copies from the host segment
    try:
        wait_until(lambda: actor.publisher.repairs == 1)  # the start-up republish
        actor.publisher.close()
        redis.restart()  # empty, and no watch to tell anyone
        actor.publisher.sync(actor.republish)
        assert actor.publisher.repairs == 2 and not actor.publisher.stale
        other = RedisDirectory(redis.url)
        ns = actor.blinder.namespace("acme")
        assert all(other.get(ns, k)[0] is Lookup.HIT for k in keys)
        other.close()
    finally:
        actor.close()
