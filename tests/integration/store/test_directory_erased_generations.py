"""A generation opened, advanced or sealed in a namespace just erased (a pool that read the
namespace before the tenant's erasure) is taken back like an entry write: nothing of the
namespace is left in the directory, its generation reads 0, and later writes into it are
taken back too. Both backends; Redis is a real redis-server."""

from __future__ import annotations

import contextlib
import uuid

import pytest
import redis as redis_py

from store.directory import DirectoryEntry, EmbeddedDirectory, MissingEntry, UnknownGeneration
from store.types import Codec, Lookup, Tier

pytestmark = pytest.mark.integration
NS, OTHER = "n" + "a" * 24, "n" + "b" * 24


def entry(generation: int, *, ns: str = NS) -> DirectoryEntry:
    return DirectoryEntry(key=b"k" * 32, tenant_ns=ns, tier=Tier.HOST, node="node-a",
                          location="host:1", codec=Codec.FULL, size_bucket=1,
                          generation=generation)


@pytest.fixture(params=["embedded", "redis"])
def backends(request):
    """(the pool's client, the eraser's client, what is left of a namespace)."""
    if request.param == "embedded":
        shared = EmbeddedDirectory()
        yield shared, shared, lambda ns: [ns] if ns in shared._spaces else []
        return
    from store.directory.redis_backend import RedisDirectory

    url, prefix = request.getfixturevalue("redis_server").url, f"t{uuid.uuid4().hex[:10]}"
    pool, eraser = RedisDirectory(url, prefix), RedisDirectory(url, prefix)
    admin = redis_py.Redis.from_url(url)
    yield pool, eraser, lambda ns: sorted(admin.scan_iter(match=f"{prefix}:{{{ns}}}:*"))
    for client in (pool, eraser, admin):
        client.close()


@pytest.mark.parametrize("late", ["open", "advance", "seal", "incref", "current"])
def test_a_generation_change_after_the_erasure_leaves_nothing_of_the_namespace(backends,
                                                                              late) -> None:
    pool, eraser, left = backends
    gen = pool.open_generation(NS)
    pool.put(entry(gen))
    pool.open_generation(OTHER)
    assert eraser.delete_namespace(NS) == 1
    assert left(NS) == []  # the test's premise
    if late == "open":
        pool.open_generation(NS)  # the pool still holds the namespace's floor
    elif late == "advance":
        pool.advance_generation(NS, gen + 3)
    elif late == "seal":
        with contextlib.suppress(UnknownGeneration):  # the embedded one: nothing opened
            pool.seal_generation(NS, gen)
    elif late == "incref":
        with pytest.raises(MissingEntry):
            pool.incref(NS, b"k" * 32)
    else:
        assert pool.current_generation(NS) == 0
    assert left(NS) == []
    assert pool.current_generation(NS) == 0 and eraser.current_generation(NS) == 0
    assert pool.get(NS, b"k" * 32) == (Lookup.MISS, None)
    assert pool.current_generation(OTHER) == 1  # another namespace is untouched


def test_a_pool_that_opens_the_erased_namespace_first_stores_nothing(backends) -> None:
    """A new client (no floor): ``open_generation`` answers a generation and keeps nothing."""
    pool, eraser, left = backends
    eraser.put(entry(eraser.open_generation(NS)))
    eraser.delete_namespace(NS)
    gen = pool.open_generation(NS)
    assert gen >= 1 and left(NS) == [] and pool.current_generation(NS) == 0
    pool.put(entry(gen))  # a store into the generation it answered is taken back too
    pool.restore([entry(gen)])
    assert left(NS) == [] and pool.current_generation(NS) == 0
