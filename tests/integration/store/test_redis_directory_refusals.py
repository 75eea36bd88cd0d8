"""A real redis-server that refuses every write for a reason other than memory: a read-only
replica (``REPLICAOF``, as a primary demoted in a failover becomes) answers ``READONLY``, and
a server whose RDB snapshot failed under ``stop-writes-on-bgsave-error yes`` answers
``MISCONF``. The directory says which (``ReadOnlyReplica``, ``PersistenceFailing``, both
``WritesRefused`` with their own ``WriteRefusal``), not a bare ``DirectoryError``; reads
still answer; ``check_writes`` says so without writing; and an erasure there is refused
instead of reporting a namespace deleted that it could not touch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from store.directory import (
    DirectoryEntry,
    PersistenceFailing,
    ReadOnlyReplica,
    WriteRefusal,
    WritesRefused,
)
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier
from tests.support.redis_refusals import failing_persistence, read_only_replica

pytestmark = pytest.mark.integration
NS = "n" + "r" * 24
EMPTY = "n" + "s" * 24  # a namespace with no key: its erasure must still be refused
KEY, NEW = b"k" * 32, b"j" * 32


def entry(generation: int, key: bytes = KEY) -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=NS, tier=Tier.HOST, node="node-a",
                          location="host:1", codec=Codec.FULL, size_bucket=1,
                          generation=generation)


def seed(url: str) -> None:
    """NS with one entry in generation 1."""
    writer = RedisDirectory(url)
    writer.put(entry(writer.open_generation(NS)))
    writer.close()


def _writes(directory: RedisDirectory, gen: int) -> dict[str, Callable[[], object]]:
    return {
        "put": lambda: directory.put(entry(gen, NEW)),
        "open_generation": lambda: directory.open_generation(NS),
        "advance_generation": lambda: directory.advance_generation(NS, gen + 2),
        "seal_generation": lambda: directory.seal_generation(NS, gen),
        "restore": lambda: directory.restore([entry(gen, NEW)]),
        "incref": lambda: directory.incref(NS, KEY),
        "delete": lambda: directory.delete(NS, KEY),
        "check_writes": directory.check_writes,
        "delete_namespace": lambda: directory.delete_namespace(NS),
        "delete_namespace (empty)": lambda: directory.delete_namespace(EMPTY),
    }


@pytest.mark.parametrize("server, kind, reason", [
    (read_only_replica, ReadOnlyReplica, WriteRefusal.READ_ONLY_REPLICA),
    (failing_persistence, PersistenceFailing, WriteRefusal.PERSISTENCE_FAILING),
], ids=["readonly", "misconf"])
def test_every_write_is_refused_with_its_reason_and_reads_answer(server, kind, reason) -> None:
    with server(seed) as (url, lift):
        directory = RedisDirectory(url)
        try:
            for name, write in _writes(directory, 1).items():
                with pytest.raises(WritesRefused) as refused:
                    write()
                assert type(refused.value) is kind and refused.value.reason is reason, name
            looked = directory.get_many(NS, [KEY, NEW])
            assert [lookup for lookup, _ in looked] == [Lookup.HIT, Lookup.MISS]  # unchanged
            lift()
            directory.check_writes()
            directory.put(entry(1, NEW))
            assert directory.get(NS, NEW)[0] is Lookup.HIT
            assert directory.delete_namespace(NS) == 2
        finally:
            directory.close()
