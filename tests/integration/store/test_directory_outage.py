"""A real redis-server stopped and restarted under the directory: the guarded backend runs
local-only (reads MISS, writes refused fast), logs each failed attempt at error level with a
growing backoff, and the watch notices the recovery and republishes."""

from __future__ import annotations

import logging
import time

import pytest

from agentkv_cluster.runtime.directory_glue import (
    Backoff,
    GuardedDirectory,
    RedisSpec,
    open_directory,
)
from agentkv_cluster.runtime.directory_watch import DirectoryWatch, directory_emptied, probe
from store.directory import DirectoryEntry, DirectoryUnavailable
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
NS = "n0outage"
LOGGER = "agentkv_cluster.runtime.directory_glue"
WATCH_LOGGER = "agentkv_cluster.runtime.directory_watch"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry(key: bytes, generation: int) -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=NS, tier=Tier.HOST, node="node0",
                          location="host:1", codec=Codec.FULL, size_bucket=3,
                          generation=generation)


@pytest.fixture
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


def test_open_directory_guards_redis(redis) -> None:
    d = open_directory(RedisSpec(url=redis.url))
    try:
        assert isinstance(d, GuardedDirectory) and isinstance(d.inner, RedisDirectory)
        gen = d.open_generation(NS)
        d.put(entry(b"k" * 16, gen))
        assert d.get(NS, b"k" * 16)[0] is Lookup.HIT
    finally:
        d.close()


def test_outage_is_local_only_logged_and_backed_off(redis, caplog) -> None:
    clock = Clock()
    d = GuardedDirectory(RedisDirectory(redis.url, socket_timeout_s=1.0),
                         Backoff(first_s=1.0, max_s=4.0), clock)
    gen = d.open_generation(NS)
    d.put(entry(b"a" * 16, gen))
    assert d.get(NS, b"a" * 16)[0] is Lookup.HIT
    redis.stop()
    caplog.set_level(logging.ERROR, logger=LOGGER)

    # The first failure: reads answer MISS (local-only), the attempt is logged at error level.
    assert d.get(NS, b"a" * 16) == (Lookup.MISS, None)
    assert not d.available and d.failures == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "running local-only" in errors[0].getMessage()

    # Within the backoff delay nothing touches the socket: writes fail at once, no new log line.
    t0 = time.perf_counter()
    for _ in range(50):
        with pytest.raises(DirectoryUnavailable, match="next attempt in"):
            d.put(entry(b"b" * 16, gen))
    fast = time.perf_counter() - t0
    assert d.failures == 1
    t1 = time.perf_counter()
    clock.now = 1.0  # the delay has passed: one real attempt, which fails and doubles the delay
    with pytest.raises(DirectoryUnavailable):
        d.put(entry(b"b" * 16, gen))
    real = time.perf_counter() - t1
    assert d.failures == 2 and d._next_try == pytest.approx(3.0)  # 1 s, then 2 s
    assert fast < 10 * real  # 50 refusals cost less than ten real attempts
    clock.now = 3.0
    with pytest.raises(DirectoryUnavailable):
        d.current_generation(NS)
    assert d._next_try == pytest.approx(7.0)  # capped doubling: 4 s
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 3

    # Redis is back (empty: no persistence). After the delay the next call succeeds.
    redis.start()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert d.get(NS, b"a" * 16) == (Lookup.MISS, None)  # still inside the delay: not tried
    clock.now = 7.0
    assert d.current_generation(NS) == gen  # the client's floor keeps the generation
    assert d.available
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    d.close()


def test_watch_logs_the_outage_and_republishes_after_restart(redis, caplog) -> None:
    spec = RedisSpec(url=redis.url)
    republished: list[int] = []
    d = RedisDirectory(redis.url)
    gen = d.open_generation(NS)
    held = [entry(bytes([i]) * 16, gen) for i in range(3)]  # what a pool holds
    for e in held:
        d.put(e)

    def republish() -> int:
        d.advance_generation(NS, gen)
        d.restore(held)
        republished.append(len(held))
        return len(held)

    watch = DirectoryWatch(lambda: probe(spec, timeout_s=0.5), on_recover=republish,
                           interval_s=0.2, backoff=Backoff(first_s=0.2, max_s=0.8))
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    assert watch.probe_once() == 0.2 and watch.up
    watch.start(first_wait_s=0.2)
    try:
        redis.stop()
        _wait(lambda: watch.up is False)
        _wait(lambda: len(_errors(caplog)) >= 3)  # it keeps retrying, each attempt logged
        assert watch.outages == 1 and republished == []
        redis.start()  # an empty server: the entries are gone until republished
        _wait(lambda: republished == [3])
        assert watch.up and watch.recoveries == 1
        assert all(d.get(NS, e.key)[0] is Lookup.HIT for e in held)
        assert any("reachable again" in r.getMessage() for r in caplog.records)
    finally:
        watch.stop()
        d.close()
    delays = [float(r.getMessage().rsplit("retrying in ", 1)[1].split()[0])
              for r in _errors(caplog)]
    assert delays[:3] == [0.2, 0.4, 0.8]  # exponential backoff, capped


@pytest.mark.parametrize("loss", ["restart", "flushall"])
def test_watch_republishes_when_redis_comes_back_empty_between_probes(redis, loss) -> None:
    """A Redis restarted (persistence off) or flushed faster than the watch probes never
    fails a probe; the watch must still see that the entries are gone and republish."""
    spec = RedisSpec(url=redis.url)
    d = RedisDirectory(redis.url)
    gen = d.open_generation(NS)
    held = [entry(bytes([i]) * 16, gen) for i in range(3)]
    for e in held:
        d.put(e)
    republished: list[int] = []

    def republish() -> int:
        d.restore(held)
        republished.append(len(held))
        return len(held)

    watch = DirectoryWatch(lambda: probe(spec, timeout_s=0.5), on_recover=republish,
                           emptied=lambda: directory_emptied(spec, timeout_s=0.5))
    try:
        watch.probe_once()
        watch.probe_once()
        assert watch.up and republished == []  # the first probe marks; nothing was lost
        if loss == "restart":
            redis.restart()
        else:
            d._client.flushall()
        assert all(d.get(NS, e.key)[0] is Lookup.MISS for e in held)
        watch.probe_once()
        assert republished == [3] and watch.up and watch.outages == watch.recoveries == 1
        assert all(d.get(NS, e.key)[0] is Lookup.HIT for e in held)
        watch.probe_once()
        assert republished == [3]  # marked again: no second republish
    finally:
        d.close()


def _errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR]


def _wait(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
