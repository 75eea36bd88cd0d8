"""One contract, every directory backend: embedded and Redis (a real redis-server)."""

from __future__ import annotations

import threading
import uuid

import pytest

from store.directory import (
    DirectoryEntry,
    EmbeddedDirectory,
    EntryInUse,
    GenerationRegression,
    InvalidEntry,
    MissingEntry,
    ReadOnlyGeneration,
    RefcountUnderflow,
    UnknownGeneration,
)
from store.types import Codec, Lookup, Tier

NS = "acme"


@pytest.fixture(params=["embedded", "redis"])
def directory(request):
    if request.param == "embedded":
        backend = EmbeddedDirectory()
    else:
        from store.directory.redis_backend import RedisDirectory

        server = request.getfixturevalue("redis_server")
        # A private key prefix per test keeps tests apart on the shared server.
        backend = RedisDirectory(server.url, prefix=f"t{uuid.uuid4().hex[:10]}")
    yield backend
    backend.close()


def entry(
    key: bytes, generation: int, *, ns: str = NS, location: str = "nvme0:0:0", refcount: int = 0
) -> DirectoryEntry:
    return DirectoryEntry(
        key=key,
        tenant_ns=ns,
        tier=Tier.NVME,
        node="node-a",
        location=location,
        codec=Codec.INT8,
        size_bucket=3,
        generation=generation,
        refcount=refcount,
    )


def test_put_get_round_trip_and_miss(directory):
    gen = directory.open_generation(NS)
    e = entry(b"k" * 32, gen, refcount=2)
    directory.put(e)
    assert directory.get(NS, b"k" * 32) == (Lookup.HIT, e)
    assert directory.get(NS, b"x" * 32) == (Lookup.MISS, None)
    assert directory.get("other", b"k" * 32) == (Lookup.MISS, None)


def test_get_many_keeps_order(directory):
    gen = directory.open_generation(NS)
    keys = [bytes([i]) * 8 for i in range(5)]
    for k in keys[::2]:
        directory.put(entry(k, gen, location=k.hex()))
    got = directory.get_many(NS, keys)
    assert [look for look, _ in got] == [
        Lookup.HIT,
        Lookup.MISS,
        Lookup.HIT,
        Lookup.MISS,
        Lookup.HIT,
    ]
    assert [e.location for _, e in got if e is not None] == [k.hex() for k in keys[::2]]


def test_generations_count_up_per_namespace(directory):
    assert directory.current_generation(NS) == 0
    assert [directory.open_generation(NS) for _ in range(3)] == [1, 2, 3]
    assert directory.current_generation(NS) == 3
    assert directory.open_generation("globex") == 1


def test_put_into_unopened_generation_is_refused(directory):
    with pytest.raises(UnknownGeneration):
        directory.put(entry(b"a", 1))
    directory.open_generation(NS)
    with pytest.raises(UnknownGeneration):
        directory.put(entry(b"a", 2))
    assert directory.get(NS, b"a") == (Lookup.MISS, None)


def test_new_generation_seals_the_old_one(directory):
    g1 = directory.open_generation(NS)
    old = entry(b"a", g1)
    directory.put(old)
    g2 = directory.open_generation(NS)
    assert g2 == g1 + 1
    with pytest.raises(ReadOnlyGeneration):
        directory.put(entry(b"a", g1, location="moved"))
    with pytest.raises(ReadOnlyGeneration):
        directory.put(entry(b"b", g1))
    assert directory.get(NS, b"a") == (Lookup.HIT, old)
    assert directory.get(NS, b"b") == (Lookup.MISS, None)


def test_update_keeps_reference_count(directory):
    gen = directory.open_generation(NS)
    directory.put(entry(b"a", gen))
    assert directory.incref(NS, b"a") == 1
    assert directory.incref(NS, b"a") == 2
    directory.put(entry(b"a", gen, location="host:7", refcount=0))
    _, got = directory.get(NS, b"a")
    assert (got.location, got.refcount) == ("host:7", 2)


def test_refcounts_and_their_errors(directory):
    gen = directory.open_generation(NS)
    directory.put(entry(b"a", gen))
    assert directory.incref(NS, b"a") == 1
    assert directory.decref(NS, b"a") == 0
    with pytest.raises(RefcountUnderflow):
        directory.decref(NS, b"a")
    with pytest.raises(MissingEntry):
        directory.incref(NS, b"zz")
    with pytest.raises(MissingEntry):
        directory.decref(NS, b"zz")
    assert directory.get(NS, b"a")[1].refcount == 0


def test_sealed_generation_takes_no_new_references_but_releases(directory):
    g1 = directory.open_generation(NS)
    directory.put(entry(b"a", g1))
    directory.incref(NS, b"a")
    directory.open_generation(NS)
    with pytest.raises(ReadOnlyGeneration):
        directory.incref(NS, b"a")
    assert directory.decref(NS, b"a") == 0


def test_delete_refuses_while_referenced(directory):
    gen = directory.open_generation(NS)
    directory.put(entry(b"a", gen))
    directory.incref(NS, b"a")
    with pytest.raises(EntryInUse):
        directory.delete(NS, b"a")
    assert directory.get(NS, b"a")[0] is Lookup.HIT
    directory.decref(NS, b"a")
    assert directory.delete(NS, b"a") is Lookup.HIT
    assert directory.delete(NS, b"a") is Lookup.MISS
    assert directory.get(NS, b"a") == (Lookup.MISS, None)


def test_reclaimable_lists_unreferenced_entries_of_sealed_generations(directory):
    g1 = directory.open_generation(NS)
    directory.put(entry(b"b", g1))
    directory.put(entry(b"a", g1))
    directory.incref(NS, b"a")
    assert directory.reclaimable(NS) == []
    g2 = directory.open_generation(NS)
    directory.put(entry(b"c", g2))
    assert [e.key for e in directory.reclaimable(NS)] == [b"b"]
    directory.decref(NS, b"a")
    assert [e.key for e in directory.reclaimable(NS)] == [b"a", b"b"]
    directory.seal_generation(NS, g2)
    assert [(e.key, e.generation) for e in directory.reclaimable(NS)] == [
        (b"a", g1),
        (b"b", g1),
        (b"c", g2),
    ]
    assert directory.reclaimable("globex") == []


def test_sealing_the_current_generation_stops_writes_until_the_next(directory):
    g1 = directory.open_generation(NS)
    directory.seal_generation(NS, g1)
    with pytest.raises(ReadOnlyGeneration):
        directory.put(entry(b"a", g1))
    with pytest.raises(UnknownGeneration):
        directory.seal_generation(NS, g1 + 1)
    g2 = directory.open_generation(NS)
    directory.put(entry(b"a", g2))
    assert directory.get(NS, b"a")[1].generation == g2


def test_generations_never_go_backwards(directory):
    for _ in range(3):
        directory.open_generation(NS)
    with pytest.raises(GenerationRegression):
        directory.advance_generation(NS, 2)
    directory.advance_generation(NS, 3)
    assert directory.current_generation(NS) == 3
    directory.advance_generation(NS, 7)
    assert directory.current_generation(NS) == 7
    assert directory.open_generation(NS) == 8


def test_restore_accepts_sealed_generations_and_never_overwrites_newer(directory):
    directory.advance_generation(NS, 5)
    directory.put(entry(b"new", 5, location="fresh"))
    directory.restore([entry(b"old", 2, refcount=4), entry(b"new", 3, location="stale")])
    assert directory.get(NS, b"old")[1] == entry(b"old", 2, refcount=0)
    assert directory.get(NS, b"new")[1].location == "fresh"
    with pytest.raises(UnknownGeneration):
        directory.restore([entry(b"x", 1), entry(b"y", 6)])
    assert directory.get(NS, b"x") == (Lookup.MISS, None)
    assert [e.key for e in directory.reclaimable(NS)] == [b"old"]


@pytest.mark.parametrize("namespace", ["", "a:b", "{x}", "a*", "t" * 65])
def test_bad_namespace_is_rejected(directory, namespace):
    with pytest.raises(InvalidEntry):
        directory.open_generation(namespace)
    with pytest.raises(InvalidEntry):
        directory.get(namespace, b"k")


def test_bad_keys_and_entries_are_rejected(directory):
    directory.open_generation(NS)
    for key in (b"", b"k" * 65, "text"):
        with pytest.raises(InvalidEntry):
            directory.get(NS, key)
    with pytest.raises(InvalidEntry):
        entry(b"a", 0)
    with pytest.raises(InvalidEntry):
        DirectoryEntry(
            key=b"a",
            tenant_ns=NS,
            tier=2,
            node="n",
            location="l",
            codec=Codec.FULL,
            size_bucket=0,
            generation=1,
        )
    with pytest.raises(InvalidEntry):
        directory.put("not an entry")


def test_concurrent_increments_are_atomic(directory):
    gen = directory.open_generation(NS)
    directory.put(entry(b"a", gen))

    def bump() -> None:
        for _ in range(100):
            directory.incref(NS, b"a")

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert directory.get(NS, b"a")[1].refcount == 400


def test_a_write_racing_the_erasure_of_its_namespace_is_taken_back(directory):
    """A writer that still holds the namespace (a pool's store or republish that read it
    before a tenant erasure) writes after ``delete_namespace``: nothing of it stays, and
    other namespaces' entries in the same batch still land."""
    gen = directory.open_generation(NS)
    directory.put(entry(b"k" * 32, gen))
    assert directory.delete_namespace(NS) == 1
    directory.put(entry(b"k" * 32, gen))
    other = directory.open_generation("globex")
    directory.restore([entry(b"j" * 32, gen), entry(b"o" * 32, other, ns="globex")])
    assert directory.get_many(NS, [b"k" * 32, b"j" * 32]) == [(Lookup.MISS, None)] * 2
    assert directory.get("globex", b"o" * 32)[0] is Lookup.HIT
