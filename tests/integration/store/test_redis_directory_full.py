"""A Redis at ``maxmemory`` under ``noeviction`` refuses every write but still answers reads
and deletions: the directory says so with ``DirectoryFull`` (not a bare ``DirectoryError``),
and ``check_writes`` asks without writing anything, so a probe cannot fill Redis itself."""

from __future__ import annotations

import pytest
import redis as redis_py

from store.directory import DirectoryEntry, DirectoryFull, WriteRefusal
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier

pytestmark = pytest.mark.integration
NS = "n" + "f" * 24


def entry(generation: int, key: bytes = b"k" * 32) -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=NS, tier=Tier.HOST, node="node-a",
                          location="host:1", codec=Codec.FULL, size_bucket=1,
                          generation=generation)


@pytest.fixture
def full(fresh_redis):
    """(directory, admin, fill): ``fill(True)`` makes Redis refuse writes, ``fill(False)``
    lifts it. ``maxmemory 1`` is below any server's use, so the refusal does not depend on
    how much memory this server happens to hold."""
    admin = redis_py.Redis.from_url(fresh_redis.url)
    admin.config_set("maxmemory-policy", "noeviction")
    directory = RedisDirectory(fresh_redis.url)

    def fill(on: bool) -> None:
        admin.config_set("maxmemory", 1 if on else 0)

    yield directory, admin, fill
    fill(False)
    directory.close()
    admin.close()


def test_every_write_refused_for_memory_is_directory_full(full) -> None:
    directory, admin, fill = full
    gen = directory.open_generation(NS)
    directory.put(entry(gen))
    fill(True)
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        admin.set("filler", b"x")  # the test's premise: Redis refuses writes
    writes = {
        "put": lambda: directory.put(entry(gen, b"j" * 32)),
        "open_generation": lambda: directory.open_generation(NS),
        "advance_generation": lambda: directory.advance_generation(NS, gen + 2),
        "restore": lambda: directory.restore([entry(gen, b"j" * 32)]),
        "incref": lambda: directory.incref(NS, b"k" * 32),
    }
    for name, write in writes.items():
        with pytest.raises(DirectoryFull) as refused:
            write()
        assert refused.value.reason is WriteRefusal.OUT_OF_MEMORY, name
    assert directory.get(NS, b"k" * 32)[0] is Lookup.HIT  # reads still answer
    assert directory.get(NS, b"j" * 32)[0] is Lookup.MISS  # nothing was written
    fill(False)
    directory.put(entry(gen, b"j" * 32))
    assert directory.get(NS, b"j" * 32)[0] is Lookup.HIT


def test_check_writes_refuses_like_a_write_and_writes_nothing(full) -> None:
    directory, admin, fill = full
    directory.put(entry(directory.open_generation(NS)))
    before = sorted(admin.scan_iter())
    directory.check_writes()  # accepted: a no-op
    assert sorted(admin.scan_iter()) == before
    fill(True)
    with pytest.raises(DirectoryFull):
        directory.check_writes()
    fill(False)
    directory.check_writes()
    assert sorted(admin.scan_iter()) == before
