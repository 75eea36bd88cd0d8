"""A tenant erasure is not a loss of the pools' directory writes, on a real redis-server.

A pool (in this process: real NIXL, /dev/shm, AES-GCM) publishes a tenant's pages; the
service's ``ClusterErasure`` purges the pool and deletes the tenant's namespace. The
pool's repair loop must not take that for lost writes (no error, no republish), a write
of the pool racing the erasure must not leave any key of the erased namespace, and a
real loss (Redis restarted empty, keys deleted by hand) must still be repaired. And an
erasure outlives a Redis restarted from a snapshot taken before it: the erasure mark keeps
the blinded namespace, and the service deletes it again (at start, and whenever the head's
watch sees the directory recover or restart); an erasure made by the CLI without
``--redis-url`` is finished the same way by the running service.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import pytest
import redis as redis_py

from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.directory_glue import RedisSpec, open_directory
from agentkv_cluster.runtime.directory_watch import watch_redis
from agentkv_cluster.runtime.erasure import ClusterErasure
from agentkv_cluster.runtime.erasure_receipts import ControllerErased, TenantForgotten
from agentkv_cluster.runtime.pool_actor import PoolActor
from security.audit import AuditLog
from security.erasure import Eraser
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer
from store.directory import DirectoryEntry
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier
from tests.support.pool_pages import front_mover, pool_spec, store_page
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
LOGGER = "agentkv_cluster.runtime.pool_publisher"


@pytest.fixture
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


@pytest.fixture
def pool(tmp_path, redis):
    actor = PoolActor(pool_spec(tmp_path, ("acme", "globex")),
                      open_directory(RedisSpec(url=redis.url)))
    actor.publisher.close()  # the test runs the repair loop's rounds itself
    front = front_mover()
    wiring.introduce(actor, front)
    yield actor, front
    actor.close()
    front.close()


class _Controller:
    def options(self, *, timeout_s: float | None) -> _Controller:
        return self

    def freeze_tenant(self, tenant: str) -> None:
        pass

    def thaw_tenant(self, tenant: str) -> None:
        pass

    def erase_tenant(self, tenant: str) -> ControllerErased:
        gone = TenantForgotten(keys={}, pages=0, resident=0, sessions=0, pins=0, cancelled=0,
                               straggling=0)
        return ControllerErased(forgotten=gone, hbm_pages=0, hbm_free_zeroed=0, hbm_actors=0)


class _PoolHandle:
    """The real pool behind the handle's ``options(...).purge_tenant``."""

    def __init__(self, actor: PoolActor) -> None:
        self.actor = actor

    def options(self, *, timeout_s: float | None) -> _PoolHandle:
        return self

    def purge_tenant(self, tenant: str, generation: int | None = None):
        return self.actor.purge_tenant(tenant, generation)


class _Topology:
    def __init__(self, url: str, actor: PoolActor) -> None:
        self.controller = _Controller()
        self.pools = {actor.name: _PoolHandle(actor)}
        self.directory = RedisSpec(url=url)


def _erasure(tmp_path, redis, actor: PoolActor) -> ClusterErasure:
    signer = Signer.generate()
    return ClusterErasure(_Topology(redis.url, actor), None, actor.spec.keys_dir,
                          AuditLog(tmp_path / "audit.log", signer), signer)


def _counted(actor: PoolActor) -> Callable[[], int]:
    def republish() -> int:
        republish.calls += 1
        return actor.republish()
    republish.calls = 0
    return republish


def _keys_of(admin: redis_py.Redis, ns: str) -> list[bytes]:
    return sorted(admin.scan_iter(match=f"akv:{{{ns}}}:*"))


def test_an_erased_namespace_is_not_taken_for_lost_writes(pool, redis, tmp_path, caplog) -> None:
    actor, front = pool
    erased = actor.blinder.namespace("acme")
    store_page(actor, front, tenant="acme", i=1)
    kept = store_page(actor, front, tenant="globex", i=2)
    _erasure(tmp_path, redis, actor).erase("acme")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    republish = _counted(actor)
    assert actor.publisher.sync(republish) == actor.publisher.interval_s
    assert republish.calls == 0 and not actor.publisher.stale
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    admin = redis_py.Redis.from_url(redis.url)
    assert _keys_of(admin, erased) == []
    other = RedisDirectory(redis.url)
    assert other.get(actor.blinder.namespace("globex"), kept)[0] is Lookup.HIT
    other.close()
    admin.close()


def test_a_republish_racing_an_erasure_leaves_no_key_of_the_namespace(pool, redis,
                                                                      tmp_path) -> None:
    """The republish reads the pool's copies, the erasure runs to its end, then the
    republish writes: what it wrote into the erased namespace is taken back."""
    actor, front = pool
    erased = actor.blinder.namespace("acme")
    store_page(actor, front, tenant="acme", i=1)
    store_page(actor, front, tenant="acme", i=3)  # the first write finds the tombstone, the second too
    kept = store_page(actor, front, tenant="globex", i=2)
    erasure = _erasure(tmp_path, redis, actor)
    restore = actor.publisher.restore

    def erased_first(entries: list[DirectoryEntry]) -> None:
        assert {e.tenant_ns for e in entries} >= {erased}  # the snapshot has acme's page
        erasure.erase("acme")
        restore(entries)

    actor.publisher.restore = erased_first
    assert actor.republish() == 1  # globex's page; acme's entries went back out
    admin = redis_py.Redis.from_url(redis.url)
    assert _keys_of(admin, erased) == []
    other = RedisDirectory(redis.url)
    assert other.get(actor.blinder.namespace("globex"), kept)[0] is Lookup.HIT
    assert actor.publisher.directory.lost_writes() == []
    other.close()
    admin.close()


def test_a_put_after_the_erasure_of_its_namespace_is_taken_back(redis) -> None:
    """A pool's entry write that lands after another client erased the namespace (a store
    committed before the purge, published after the directory step)."""
    pool_client, eraser = RedisDirectory(redis.url), RedisDirectory(redis.url)
    ns = "n" + "a" * 24
    gen = pool_client.open_generation(ns)
    entry = DirectoryEntry(key=b"k" * 32, tenant_ns=ns, tier=Tier.HOST, node="node-a",
                           location="host:1", codec=Codec.FULL, size_bucket=4096,
                           generation=gen)
    pool_client.put(entry)
    assert eraser.delete_namespace(ns) == 1
    pool_client.put(entry)  # the client still holds the namespace's floor and mark
    admin = redis_py.Redis.from_url(redis.url)
    assert _keys_of(admin, ns) == []
    assert pool_client.lost_writes() == []
    admin.close()
    pool_client.close()
    eraser.close()


@pytest.mark.parametrize("loss", ["restart-empty", "namespace-deleted-by-hand",
                                  "write-count-deleted-by-hand"])
def test_a_real_loss_after_an_erasure_is_still_repaired(pool, redis, tmp_path, loss,
                                                        caplog) -> None:
    actor, front = pool
    erased, live = actor.blinder.namespace("acme"), actor.blinder.namespace("globex")
    store_page(actor, front, tenant="acme", i=1)
    kept = store_page(actor, front, tenant="globex", i=2)
    _erasure(tmp_path, redis, actor).erase("acme")
    admin = redis_py.Redis.from_url(redis.url)
    if loss == "restart-empty":
        redis.restart()
    elif loss == "namespace-deleted-by-hand":
        admin.delete(*_keys_of(admin, live))
    else:
        admin.delete(f"akv:{{{live}}}:w:{actor.name}")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    republish = _counted(actor)
    actor.publisher.sync(republish)
    assert republish.calls == 1 and not actor.publisher.stale
    assert any(r.levelno == logging.ERROR and "lost writes" in r.getMessage()
               for r in caplog.records)
    other = RedisDirectory(redis.url)
    assert other.get(live, kept)[0] is Lookup.HIT
    assert _keys_of(admin, erased) == []  # the erased tenant is not written back
    other.close()
    admin.close()


def test_the_erasure_tombstone_passes_the_isolation_audit(pool, redis, tmp_path) -> None:
    """The tombstone lives under a name shaped like a blinded namespace and stores no time."""
    from security.isolation import scan_for_leaks

    actor, front = pool
    store_page(actor, front, tenant="acme", i=1)
    store_page(actor, front, tenant="globex", i=2)
    _erasure(tmp_path, redis, actor).erase("acme")
    admin = redis_py.Redis.from_url(redis.url)
    assert any(b"erased" in k for k in admin.scan_iter())  # the test's premise
    assert scan_for_leaks(admin) == []
    admin.close()


def test_an_out_of_memory_redis_still_loses_every_key_of_an_erased_namespace(redis) -> None:
    """Redis at ``maxmemory`` refuses the tombstone (a write) but not deletions: the keys go
    first, which frees memory, then the tombstone; no erasure is failed for want of it."""
    d = RedisDirectory(redis.url)
    ns = "n" + "a" * 24
    gen = d.open_generation(ns)
    for i in range(5):
        d.put(DirectoryEntry(key=bytes([i]) * 32, tenant_ns=ns, tier=Tier.HOST, node="node-a",
                             location="host:1", codec=Codec.FULL, size_bucket=4096,
                             generation=gen))
    admin = redis_py.Redis.from_url(redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 1024)
    with pytest.raises(redis_py.exceptions.ResponseError, match="OOM|maxmemory"):
        admin.set("filler", b"x" * 100_000)  # the test's premise: writes are refused
    try:
        assert RedisDirectory(redis.url).delete_namespace(ns) == 5
        assert _keys_of(admin, ns) == []
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        d.close()


@pytest.mark.parametrize("trouble", ["writes-stalled", "restarted"])
def test_the_directory_step_waits_out_a_stalled_or_restarting_redis(pool, redis, tmp_path,
                                                                   trouble) -> None:
    """Once the keys are shredded nothing can name the namespace again: a directory step
    that gave up on a Redis stalled past the socket timeout (or down for a restart) would
    leave the erased tenant's keys in Redis for good."""
    actor, front = pool
    erased = actor.blinder.namespace("acme")
    store_page(actor, front, tenant="acme", i=1)
    admin = redis_py.Redis.from_url(redis.url)
    if trouble == "writes-stalled":  # longer than the erasure client's 2 s socket timeout
        admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
        back = None
    else:
        redis.stop()
        back = threading.Timer(3.0, redis.start)
        back.start()
    receipt = _erasure(tmp_path, redis, actor).erase("acme")
    if back is not None:
        back.join()
    assert receipt.failed_tiers == ()
    assert _keys_of(admin, erased) == []
    admin.close()


def test_tombstones_keep_the_newest_erasures_numbered_not_timed(redis, monkeypatch) -> None:
    from store.directory import redis_backend

    monkeypatch.setattr(redis_backend, "ERASED_KEEP", 2)
    d = RedisDirectory(redis.url)
    names = ["n" + c * 24 for c in "abc"]
    for ns in names + names[1:2]:  # the second erased twice: it moves up
        d.delete_namespace(ns)
    admin = redis_py.Redis.from_url(redis.url)
    key = f"akv:{{{redis_backend.TOMBSTONES}}}:erased"
    assert admin.zrange(key, 0, -1, withscores=True) == [(names[2].encode(), 3.0),
                                                         (names[1].encode(), 4.0)]
    admin.close()
    d.close()


# -- an erasure outlives a directory that comes back from an older snapshot ---------------
def _records(path, kind: str) -> list[dict]:
    return [r["data"] for r in map(json.loads, path.read_text().splitlines())
            if r["kind"] == kind]


def test_a_namespace_a_snapshot_brings_back_is_erased_again(pool, redis, tmp_path) -> None:
    actor, front = pool
    erased, kept_ns = actor.blinder.namespace("acme"), actor.blinder.namespace("globex")
    store_page(actor, front, tenant="acme", i=1)
    store_page(actor, front, tenant="acme", i=3)
    kept = store_page(actor, front, tenant="globex", i=2)
    admin = redis_py.Redis.from_url(redis.url)
    admin.save()  # the snapshot: taken before the erasure
    erasure = _erasure(tmp_path, redis, actor)
    assert erasure.reapply_directory() == 0  # nothing erased yet
    erasure.erase("acme")
    assert _keys_of(admin, erased) == []
    admin.close()
    redis.restart()  # killed (no save at exit), started from the old snapshot
    admin = redis_py.Redis.from_url(redis.url)
    assert _keys_of(admin, erased) != []  # the scenario: the erased namespace is back
    assert erasure.reapply_directory() == 1
    assert _keys_of(admin, erased) == []
    assert erasure.reapply_directory() == 0  # done: nothing held any more
    [record] = _records(tmp_path / "audit.log", "erasure.reapplied")
    assert record["tenant"] == "acme" and record["counts"] == [["directory", 2]]
    other = RedisDirectory(redis.url)
    assert other.get(kept_ns, kept)[0] is Lookup.HIT  # the other tenant's entry stays
    other.close()
    admin.close()


def test_the_watch_calls_its_recovery_after_a_restart_that_kept_data(redis) -> None:
    """A restart between two probes that neither emptied the server nor failed a probe:
    only the server's new run id shows it."""
    calls: list[float] = []
    watch = watch_redis(RedisSpec(url=redis.url), on_recover=lambda: calls.append(1.0))
    assert watch.probe_once() == watch.interval_s and calls == []
    admin = redis_py.Redis.from_url(redis.url)
    admin.save()  # with the watch's marker: the restart does not empty it
    admin.close()
    assert watch.probe_once() == watch.interval_s and calls == []  # no restart: no call
    redis.restart()
    watch.probe_once()
    assert calls == [1.0] and watch.recoveries == 1 and watch.outages == 1
    watch.probe_once()
    assert calls == [1.0]  # once per restart


def test_an_erasure_by_the_cli_without_the_directory_step_is_finished_by_the_service(
        pool, redis, tmp_path) -> None:
    """``agentkv tenant erase`` without ``--redis-url`` destroys the keys and marks the
    tenant; the service's enforcement deletes the namespace the mark names."""
    actor, front = pool
    erased = actor.blinder.namespace("acme")
    store_page(actor, front, tenant="acme", i=1)
    erasure = _erasure(tmp_path, redis, actor)
    signer = Signer.generate()
    cli_log = AuditLog(tmp_path / "cli-audit.log", signer)
    Eraser(TenantKeyring(FileKeySource(actor.spec.keys_dir)), cli_log, signer).erase_tenant(
        "acme", time.time())
    cli_log.close()
    admin = redis_py.Redis.from_url(redis.url)
    assert _keys_of(admin, erased) != []  # the CLI did not touch the directory
    assert erasure.enforce_new_marks() == ["acme"]
    assert _keys_of(admin, erased) == []
    [record] = _records(tmp_path / "audit.log", "erasure.enforced")
    counts = dict(map(tuple, record["counts"]))
    assert counts["directory"] == 1 and record["failed_tiers"] == []
    admin.close()


def test_a_directory_that_refuses_the_check_is_logged_not_retried(pool, redis, tmp_path,
                                                                  caplog) -> None:
    """A Redis user without the right to look (here: no EXISTS) makes the check fail for
    good: said once at error level, not raised (the watch would retry it forever)."""
    actor, front = pool
    store_page(actor, front, tenant="acme", i=1)
    erasure = _erasure(tmp_path, redis, actor)
    erasure.erase("acme")
    admin = redis_py.Redis.from_url(redis.url)
    admin.execute_command("ACL", "SETUSER", "nocheck", "on", ">pw", "~*", "&*", "+@all",
                          "-exists")
    admin.close()
    erasure.topo.directory = RedisSpec(url=f"redis://nocheck:pw@127.0.0.1:{redis.port}/0")
    caplog.set_level(logging.ERROR, logger="agentkv_cluster.runtime.erasure")
    assert erasure.reapply_directory() == 0
    assert any("agentkv audit erased" in r.getMessage() for r in caplog.records)
