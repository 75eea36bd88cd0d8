"""A Redis that refuses writes for memory (``maxmemory`` under ``noeviction``) is visible on
the head, not only in the pools' worker logs: the probe says so without writing, ``/readyz``
stays ready with a line that says so, the watch logs it once per streak at error level and
reports it for ``agentkv_directory_refuses_writes``, and a pool logs its refused republish
at error level once. Real redis-server."""

from __future__ import annotations

import logging

import pytest
import redis as redis_py

from agentkv_cluster.runtime.directory_glue import RedisSpec, open_directory
from agentkv_cluster.runtime.directory_watch import probe, probe_redis, watch_redis
from agentkv_cluster.runtime.pool_publisher import PoolPublisher
from store.directory import DirectoryEntry, WriteRefusal
from store.types import Codec, Tier

pytestmark = pytest.mark.integration
GLUE = "agentkv_cluster.runtime.directory_glue"
PUBLISHER = "agentkv_cluster.runtime.pool_publisher"


@pytest.fixture
def redis(fresh_redis):
    """(spec, fill): ``fill(True)`` makes Redis refuse every write, ``fill(False)`` lifts it."""
    admin = redis_py.Redis.from_url(fresh_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")

    def fill(on: bool) -> None:
        admin.config_set("maxmemory", 1 if on else 0)

    yield RedisSpec(url=fresh_redis.url), fill
    fill(False)
    admin.close()


def test_the_probe_sees_refused_writes_and_readiness_stays_ready(redis) -> None:
    spec, fill = redis
    assert probe_redis(spec).refusal is None and probe(spec) == (True, "directory ok")
    fill(True)
    seen = probe_redis(spec)
    assert seen.up and seen.refusal is WriteRefusal.OUT_OF_MEMORY
    ready, line = probe(spec)
    assert ready and "refuses writes" in line and "out of memory" in line
    fill(False)
    assert probe_redis(spec).refusal is None


def test_the_watch_logs_a_refusal_streak_once_and_reports_it(redis, caplog) -> None:
    spec, fill = redis
    ups: list[bool] = []
    refusals: list[WriteRefusal | None] = []
    watch = watch_redis(spec, on_probe=ups.append, on_refusal=refusals.append)
    caplog.set_level(logging.WARNING, logger=GLUE)
    watch.probe_once()
    fill(True)
    watch.probe_once()
    watch.probe_once()
    fill(False)
    watch.probe_once()
    assert ups == [True] * 4
    assert refusals == [None, WriteRefusal.OUT_OF_MEMORY, WriteRefusal.OUT_OF_MEMORY, None]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, message in lines if "refuses writes" in message] == [logging.ERROR]
    assert [level for level, message in lines if "accepts writes again" in message] == [
        logging.WARNING]
    assert watch.outages == 0  # reads still work: no outage


def test_a_pool_logs_its_refused_republish_at_error_level_once(redis, caplog) -> None:
    spec, fill = redis
    publisher = PoolPublisher(open_directory(spec))
    ns = "n" + "p" * 24
    entry = DirectoryEntry(key=b"k" * 32, tenant_ns=ns, tier=Tier.HOST, node="node-a",
                           location="host:1", codec=Codec.FULL, size_bucket=1,
                           generation=publisher.generation(ns))

    def republish() -> int:
        token = publisher.republishing()
        publisher.restore([entry])
        publisher.republished(token)
        return 1

    caplog.set_level(logging.DEBUG, logger=PUBLISHER)
    fill(True)
    publisher.put(entry)
    assert publisher.stale  # the test's premise: the write was refused
    publisher.sync(republish)
    publisher.sync(republish)
    refused = [r for r in caplog.records if "refuses this pool's writes" in r.getMessage()]
    assert [r.levelno for r in refused] == [logging.ERROR]
    fill(False)
    publisher.sync(republish)
    assert not publisher.stale
    assert publisher.directory.get(ns, b"k" * 32)[1] == entry
    publisher.close()
    publisher.directory.close()
