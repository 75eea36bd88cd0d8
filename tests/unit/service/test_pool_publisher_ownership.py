"""The pool's repair loop owns its directory entries: copies adopted at start-up are
republished once by its first round (nothing in the new process wrote them, so no later
loss of them could be seen), and a pool that adopted nothing republishes nothing. The
head's watch, as the service builds it, never republishes."""

from __future__ import annotations

import threading

from agentkv_cluster.runtime.directory_glue import RedisSpec
from agentkv_cluster.runtime.directory_watch import watch_redis
from agentkv_cluster.runtime.pool_publisher import PoolPublisher


class _Directory:
    def current_generation(self, namespace: str) -> int:
        return 1

    def lost_writes(self) -> list[str]:
        return []


def _run_first_round(publisher: PoolPublisher) -> int:
    done = threading.Event()
    calls: list[int] = []

    def republish() -> int:  # what ``PoolActor.republish`` does around its writes
        publisher.republished(publisher.republishing())
        calls.append(1)
        done.set()
        return 0

    publisher.start(republish)
    try:
        done.wait(5.0)
    finally:
        publisher.close()
    return len(calls)


def test_copies_adopted_at_start_up_are_republished_by_the_first_round() -> None:
    publisher = PoolPublisher(_Directory(), interval_s=600.0)  # only a wake-up runs a round
    publisher.saw("n0pool", 3)
    assert _run_first_round(publisher) == 1
    assert not publisher.stale and publisher.repairs == 1


def test_a_pool_that_adopted_nothing_republishes_nothing_at_start_up() -> None:
    publisher = PoolPublisher(_Directory(), interval_s=0.05)
    done = threading.Event()
    rounds: list[float] = []
    real_sync = publisher.sync

    def sync(republish) -> float:
        wait = real_sync(republish)
        rounds.append(wait)
        if len(rounds) >= 3:
            done.set()
        return wait

    publisher.sync = sync
    calls: list[int] = []
    publisher.start(lambda: calls.append(1) or 0)
    try:
        assert done.wait(5.0)
    finally:
        publisher.close()
    assert calls == [] and publisher.repairs == 0


def test_the_service_watch_has_nothing_to_republish() -> None:
    watch = watch_redis(RedisSpec(url="redis://127.0.0.1:1/0"), retry_max_s=7.0)
    assert watch.on_recover is None and watch.emptied is not None
    assert watch.backoff.max_s == 7.0
