"""The Redis directory's upkeep on a real redis-server: writes a server lost (restarted from
an older snapshot, or emptied) are reported by ``lost_writes``, and the ``gens`` set holds
only generations with entries (and at most the current one besides)."""

from __future__ import annotations

import pytest
import redis as redis_py

from store.directory import DirectoryEntry, ReportsLostWrites
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier

pytestmark = pytest.mark.integration
NS, OTHER = "n0upkeep", "n0other"


def entry(key: bytes, generation: int, *, ns: str = NS, node: str = "pool-a") -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=ns, tier=Tier.HOST, node=node, location="host:1",
                          codec=Codec.FULL, size_bucket=1, generation=generation)


@pytest.fixture
def server(fresh_redis):
    admin = redis_py.Redis.from_url(fresh_redis.url)
    yield fresh_redis, admin
    admin.close()


def _gens(admin, ns: str = NS) -> set[int]:
    return {int(g) for g in admin.smembers(f"akv:{{{ns}}}:gens")}


# -- lost writes -------------------------------------------------------------------------------
def test_lost_writes_names_the_namespace_whose_newest_writes_a_restart_dropped(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    assert isinstance(d, ReportsLostWrites)
    gen, other_gen = d.open_generation(NS), d.open_generation(OTHER)
    d.put(entry(b"a" * 16, gen))
    d.put(entry(b"o" * 16, other_gen, ns=OTHER))
    admin.save()
    d.put(entry(b"b" * 16, gen))  # newer than the snapshot
    redis.restart()  # from the snapshot
    assert d.get(NS, b"b" * 16) == (Lookup.MISS, None) and d.get(NS, b"a" * 16)[0] is Lookup.HIT
    assert d.lost_writes() == [NS]  # OTHER lost nothing
    assert d.lost_writes() == []  # told once: the caller republishes
    d.put(entry(b"b" * 16, gen))
    assert d.lost_writes() == []
    d.close()


def test_a_put_after_the_loss_reports_it_even_when_the_count_caught_up(server) -> None:
    """More new writes than were lost lift the server's count above the client's mark; the
    first put after the restart already saw the count go back."""
    redis, admin = server
    d = RedisDirectory(redis.url)
    gen = d.open_generation(NS)
    d.put(entry(b"a" * 16, gen))
    admin.save()
    d.put(entry(b"b" * 16, gen))
    redis.restart()
    for i in range(3):
        d.put(entry(bytes([i]) * 16, gen))
    assert int(admin.get(f"akv:{{{NS}}}:w:pool-a")) == 4  # above the mark of 2
    assert d.lost_writes() == [NS]
    assert d.lost_writes() == []
    d.close()


def test_lost_writes_stays_quiet_when_nothing_was_lost(server) -> None:
    redis, admin = server
    d, other_node = RedisDirectory(redis.url), RedisDirectory(redis.url)
    gen = d.open_generation(NS)
    d.put(entry(b"a" * 16, gen))
    other_node.put(entry(b"b" * 16, gen, node="pool-b"))
    admin.save()
    redis.restart()  # everything was in the snapshot
    assert d.lost_writes() == [] and other_node.lost_writes() == []
    d.put(entry(b"c" * 16, gen))
    assert d.lost_writes() == []
    assert RedisDirectory(redis.url).lost_writes() == []  # a new client wrote nothing
    d.close()
    other_node.close()


def test_lost_writes_reports_an_emptied_server(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    d.put(entry(b"a" * 16, d.open_generation(NS)))
    admin.flushall()
    assert d.lost_writes() == [NS]
    assert d.lost_writes() == []
    d.close()


# -- the gens set ------------------------------------------------------------------------------
def test_gens_does_not_grow_with_generations_whose_entries_are_gone(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    d.put(entry(b"keep" * 4, d.open_generation(NS)))  # generation 1 keeps an entry
    for _ in range(200):
        gen = d.open_generation(NS)
        d.put(entry(b"x" * 16, gen))
        d.delete(NS, b"x" * 16)
    assert _gens(admin) == {1, 201}  # the one with an entry, and the current one
    d.open_generation(NS)
    assert _gens(admin) == {1}  # 201 was left empty when 202 opened
    d.delete(NS, b"keep" * 4)
    assert _gens(admin) == set()
    assert admin.exists(f"akv:{{{NS}}}:gens") == 0
    d.close()


def test_gens_keeps_the_current_generation_and_every_one_with_entries(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    g1 = d.open_generation(NS)
    d.put(entry(b"a" * 16, g1))
    d.put(entry(b"b" * 16, g1))
    g2 = d.open_generation(NS)
    d.put(entry(b"c" * 16, g2))
    d.delete(NS, b"a" * 16)
    assert _gens(admin) == {g1, g2}  # g1 still holds b
    d.delete(NS, b"c" * 16)
    assert _gens(admin) == {g1, g2}  # g2 is empty but current: a put may come any time
    d.put(entry(b"c" * 16, g2))
    assert d.reclaimable(NS) == [d.get(NS, b"b" * 16)[1]]
    g3 = d.open_generation(NS)
    d.advance_generation(NS, g3 + 5)
    assert _gens(admin) == {g1, g2}  # both hold entries; g3 never had one
    d.close()


def test_an_entry_moved_to_a_newer_generation_takes_the_old_one_out(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    g1 = d.open_generation(NS)
    d.put(entry(b"a" * 16, g1))
    g2 = d.open_generation(NS)
    d.put(entry(b"a" * 16, g2))  # the page stored again in the current generation
    assert _gens(admin) == {g2}
    assert admin.exists(f"akv:{{{NS}}}:g:{g1}") == 0
    redis.restart()  # emptied: a republish restores it into its old generation
    d.restore([entry(b"a" * 16, g1)])
    d.restore([entry(b"a" * 16, g2)])
    assert _gens(admin) == {g2}
    d.close()


def test_reclaimable_drops_empty_generations_an_older_server_left(server) -> None:
    redis, admin = server
    d = RedisDirectory(redis.url)
    for _ in range(3):
        d.open_generation(NS)
    d.put(entry(b"a" * 16, 3))
    admin.sadd(f"akv:{{{NS}}}:gens", 1, 2)  # as the scripts before this change left them
    d.seal_generation(NS, 3)
    assert [e.key for e in d.reclaimable(NS)] == [b"a" * 16]
    assert _gens(admin) == {3}
    d.close()
