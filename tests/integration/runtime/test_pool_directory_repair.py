"""A pool on a real redis-server keeps its copies published without the head's watch: a
write lost to a blip too short for the watch to see, or dropped by a Redis restarted from
an older snapshot (its marker kept), comes back by the pool's own republish, so another
node's lookup finds the page (the pool in this process: real NIXL, /dev/shm, AES-GCM).
Then the repair loop's decisions (backoff, stale, wake-up) on a directory failing on demand."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
import redis as redis_py

from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.directory_glue import GUARD_BACKOFF, Backoff, RedisSpec, open_directory
from agentkv_cluster.runtime.directory_watch import directory_emptied
from agentkv_cluster.runtime.pool_actor import PoolActor
from agentkv_cluster.runtime.pool_publisher import PoolPublisher
from security.keyring import FileKeySource, TenantKeyring
from store.directory import DirectoryEntry, DirectoryUnavailable
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier
from tests.support.pool_pages import front_mover, pool_spec, store_page, wait_until
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def redis():
    server = RedisProcess().start()  # no automatic snapshots; the tests SAVE by hand
    yield server
    server.close()


@pytest.fixture
def pool(tmp_path, redis):
    actor = PoolActor(pool_spec(tmp_path), open_directory(RedisSpec(url=redis.url)))
    front = front_mover()
    wiring.introduce(actor, front)
    yield actor, front
    actor.close()
    front.close()


def test_a_write_failed_in_a_blip_is_published_once_redis_answers(pool, redis) -> None:
    actor, front = pool
    spec = RedisSpec(url=redis.url)
    other = RedisDirectory(redis.url)  # another node's view of the directory
    ns = actor.blinder.namespace("acme")
    directory_emptied(spec)  # the head's watch marks the directory
    first = store_page(actor, front, 1)
    assert other.get(ns, first)[0] is Lookup.HIT
    redis_py.Redis.from_url(redis.url).save()
    redis.stop()  # a blip shorter than the watch's 5 s between probes
    second = store_page(actor, front, 2)  # stored locally; its entry cannot be written
    assert actor.publisher.stale
    redis.start()  # back with everything it had: the watch sees nothing to republish
    assert not directory_emptied(spec)
    try:
        wait_until(lambda: other.get(ns, second)[0] is Lookup.HIT)
        wait_until(lambda: not actor.publisher.stale)
        assert other.get(ns, first)[0] is Lookup.HIT
        assert other.get(ns, second)[1].node == actor.name
    finally:
        other.close()


def test_entries_a_snapshot_restart_dropped_are_published_again(pool, redis) -> None:
    actor, front = pool
    spec = RedisSpec(url=redis.url)
    other = RedisDirectory(redis.url)
    ns = actor.blinder.namespace("acme")
    directory_emptied(spec)
    kept = store_page(actor, front, 1)
    redis_py.Redis.from_url(redis.url).save()
    newest = [store_page(actor, front, i) for i in (2, 3)]  # after the snapshot
    assert all(other.get(ns, k)[0] is Lookup.HIT for k in newest)
    redis.restart()  # from the snapshot: the newest entries are gone, the marker is not
    assert not directory_emptied(spec)
    assert [other.get(ns, k)[0] for k in (kept, *newest)] == [Lookup.HIT, Lookup.MISS,
                                                               Lookup.MISS]
    try:
        wait_until(lambda: all(other.get(ns, k)[0] is Lookup.HIT for k in newest))
        assert not actor.publisher.stale and actor.publisher.repairs == 1
    finally:
        other.close()


def test_republish_leaves_out_a_tenant_erased_by_another_process(pool, redis) -> None:
    """``agentkv tenant erase --redis-url`` shreds the keys and deletes the namespace's
    directory keys (its write counts too) before the service purges the pools: a republish
    in between must not write the erased tenant's entries back."""
    actor, front = pool
    ns = actor.blinder.namespace("acme")  # cached in the pool, as in a running service
    key = store_page(actor, front, 1)
    TenantKeyring(FileKeySource(actor.spec.keys_dir)).destroy_tenant("acme")
    admin = redis_py.Redis.from_url(redis.url)
    admin.delete(*admin.keys(f"akv:{{{ns}}}:*"))
    assert actor.republish() == 0
    assert admin.keys(f"akv:{{{ns}}}:*") == []
    assert actor.holds_many([key]) != [None]  # still held: the purge comes next
    admin.close()


# -- the repair loop's decisions, on a directory that fails on demand -------------------------
class FlakyDirectory:
    """Writes fail while ``down``; ``lost`` is what the next ``lost_writes`` reports."""

    def __init__(self) -> None:
        self.down = False
        self.lost: list[str] = []
        self.entries: dict[bytes, object] = {}

    def _check(self) -> None:
        if self.down:
            raise DirectoryUnavailable("redis unreachable")

    def put(self, e: DirectoryEntry) -> None:
        self._check()
        self.entries[e.key] = e

    def delete(self, namespace: str, key: bytes) -> None:
        self._check()
        self.entries.pop(key, None)

    def current_generation(self, namespace: str) -> int:
        self._check()
        return 1

    def lost_writes(self) -> list[str]:
        self._check()
        lost, self.lost = self.lost, []
        return lost


def _entry(i: int) -> DirectoryEntry:
    return DirectoryEntry(key=bytes([i]) * 16, tenant_ns="n0pool", tier=Tier.HOST, node="p",
                          location="host:1", codec=Codec.FULL, size_bucket=1, generation=1)


def _republisher(publisher: PoolPublisher, directory: FlakyDirectory, held: list[DirectoryEntry],
                 during: Callable[[], None] = lambda: None) -> Callable[[], int]:
    """What ``PoolActor.republish`` does, for ``held``: counted in ``calls``."""
    def republish() -> int:
        token = publisher.republishing()
        directory._check()
        during()
        for e in held:
            directory.put(e)
        publisher.republished(token)
        republish.calls += 1
        return len(held)
    republish.calls = 0
    return republish


def test_republish_backs_off_while_the_directory_fails_then_clears_stale() -> None:
    directory = FlakyDirectory()
    publisher = PoolPublisher(directory, interval_s=7.0, backoff=Backoff(first_s=0.5, max_s=2.0))
    republish = _republisher(publisher, directory, [_entry(1)])
    assert publisher.sync(republish) == 7.0 and republish.calls == 0  # fresh: nothing to do
    directory.down = True
    publisher.put(_entry(1))
    assert publisher.stale
    assert [publisher.sync(republish) for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    assert publisher.stale and republish.calls == 0
    directory.down = False
    assert publisher.sync(republish) == 7.0
    assert not publisher.stale and republish.calls == 1 and _entry(1).key in directory.entries
    assert publisher.sync(republish) == 7.0 and republish.calls == 1


def test_a_write_failing_during_a_republish_keeps_the_pool_stale() -> None:
    directory = FlakyDirectory()
    publisher = PoolPublisher(directory, interval_s=7.0)
    republish = _republisher(publisher, directory, [], during=publisher.failed)
    publisher.failed()
    assert publisher.sync(republish) == GUARD_BACKOFF.first_s  # soon again, not in 7 s
    assert publisher.stale and republish.calls == 1  # that write may have been missed
    plain = _republisher(publisher, directory, [])
    publisher.sync(plain)
    assert not publisher.stale


def test_writes_a_backend_reports_lost_are_republished_without_a_failed_write(caplog) -> None:
    directory = FlakyDirectory()
    publisher = PoolPublisher(directory, interval_s=7.0)
    republish = _republisher(publisher, directory, [_entry(1)])
    directory.lost = ["n0pool"]
    caplog.set_level(logging.WARNING, logger="agentkv_cluster.runtime.pool_publisher")
    assert publisher.sync(republish) == 7.0
    assert republish.calls == 1 and not publisher.stale
    assert any(r.levelno == logging.ERROR and "lost writes" in r.getMessage()
               for r in caplog.records)
    assert any("republished 1 directory entries" in r.getMessage() for r in caplog.records)


def test_a_failed_write_wakes_the_loop_and_never_waits_for_the_republish() -> None:
    directory = FlakyDirectory()
    publisher = PoolPublisher(directory, interval_s=600.0)  # only a failed write wakes it
    entered, release = threading.Event(), threading.Event()

    def blocked() -> None:
        entered.set()
        release.wait(30)

    republish = _republisher(publisher, directory, [_entry(1)], during=blocked)
    publisher.start(republish)
    try:
        directory.down = True
        publisher.put(_entry(1))
        directory.down = False
        assert entered.wait(30)  # woken at once, not after the 600 s interval
        directory.down = True
        publisher.put(_entry(2))  # the store path goes on while the republish is stuck
        directory.down = False
        assert not release.is_set() and republish.calls == 0
        release.set()
        wait_until(lambda: republish.calls >= 1)
        wait_until(lambda: not publisher.stale)  # the second failure got a republish of its own
        assert republish.calls == 2
    finally:
        release.set()
        publisher.close()
