"""The pool publisher's generations and repair decisions on the embedded directory (the
real backend, in this process; no Redis, no Ray): a pool never goes back below a
generation it has used (a directory reopened lower by another pool is advanced, an
outage keeps the highest it saw), a namespace's generation is read once, an entry
refused by a directory emptied meanwhile is published again at once, a republish raises
each namespace to the highest generation its entries carry, and the loop backs off while
``lost_writes`` fails and logs a new refusal streak again after a success."""

from __future__ import annotations

import logging

from agentkv_cluster.runtime.directory_glue import Backoff
from agentkv_cluster.runtime.pool_publisher import PoolPublisher
from store.directory import DirectoryEntry, DirectoryUnavailable, EmbeddedDirectory
from store.directory.base import DirectoryFull
from store.types import Codec, Lookup, Tier

NS = "n" + "g" * 24
PUBLISHER = "agentkv_cluster.runtime.pool_publisher"


class _Directory(EmbeddedDirectory):
    """The embedded directory, unreachable while ``down``; ``lost`` answers ``lost_writes``
    (raising while ``lost`` is an exception)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lost: list[str] | Exception = []

    def current_generation(self, namespace: str) -> int:
        if self.down:
            raise DirectoryUnavailable("redis unreachable")
        return super().current_generation(namespace)

    def lost_writes(self) -> list[str]:
        if isinstance(self.lost, Exception):
            raise self.lost
        return self.lost


def _entry(i: int, generation: int) -> DirectoryEntry:
    return DirectoryEntry(key=bytes([i]) * 16, tenant_ns=NS, tier=Tier.HOST, node="node0",
                          location="host:1", codec=Codec.FULL, size_bucket=1,
                          generation=generation)


def test_a_generation_reopened_lower_by_another_pool_is_advanced_back() -> None:
    directory = _Directory()
    publisher = PoolPublisher(directory)
    publisher.saw(NS, 3)  # copies of generation 3 found on the tiers at start-up
    assert directory.open_generation(NS) == 1  # another pool, after Redis came back empty
    assert publisher.generation(NS) == 3
    assert directory.current_generation(NS) == 3
    publisher.put(_entry(1, 3))
    assert directory.get(NS, _entry(1, 3).key)[0] is Lookup.HIT and not publisher.stale


def test_an_outage_keeps_the_highest_generation_seen() -> None:
    directory = _Directory()
    publisher = PoolPublisher(directory)
    publisher.saw(NS, 4)
    directory.down = True
    assert publisher.generation(NS) == 4
    assert publisher.stale


def test_a_namespaces_generation_is_read_once() -> None:
    directory = _Directory()
    publisher = PoolPublisher(directory)
    assert [publisher.generation(NS) for _ in range(3)] == [1, 1, 1]
    assert publisher.reads == 1 and directory.current_generation(NS) == 1


def test_an_entry_refused_by_an_emptied_directory_is_published_at_once() -> None:
    publisher = PoolPublisher(_Directory())
    gen = publisher.generation(NS)
    publisher.put(_entry(1, gen))
    publisher.directory = emptied = _Directory()  # Redis restarted empty
    publisher.put(_entry(2, gen))  # refused (no generation open): read again, retried
    assert emptied.get(NS, _entry(2, gen).key)[0] is Lookup.HIT
    assert emptied.current_generation(NS) == gen and not publisher.stale


def test_a_republish_raises_the_generation_to_its_highest_entry() -> None:
    directory = _Directory()
    publisher = PoolPublisher(directory)
    entries = [_entry(1, 2), _entry(2, 5), _entry(3, 3)]
    publisher.restore(entries)
    assert directory.current_generation(NS) == 5
    assert [directory.get(NS, e.key)[1] for e in entries] == entries


def test_the_loop_backs_off_while_lost_writes_fails() -> None:
    directory = _Directory()
    publisher = PoolPublisher(directory, interval_s=7.0, backoff=Backoff(first_s=0.5, max_s=2.0))
    directory.lost = DirectoryUnavailable("redis unreachable")
    assert [publisher.sync(lambda: 0) for _ in range(3)] == [0.5, 1.0, 2.0]
    directory.lost = []
    assert publisher.sync(lambda: 0) == 7.0


def test_each_refusal_streak_is_logged_at_error_level(caplog) -> None:
    publisher = PoolPublisher(_Directory(), interval_s=7.0)
    refuse = [True]

    def republish() -> int:
        token = publisher.republishing()
        if refuse[0]:
            raise DirectoryFull("OOM command not allowed when used memory > 'maxmemory'")
        publisher.republished(token)
        return 0

    caplog.set_level(logging.DEBUG, logger=PUBLISHER)
    for streak in range(2):
        publisher.failed()
        refuse[0] = True
        publisher.sync(republish)
        publisher.sync(republish)
        refuse[0] = False
        assert publisher.sync(republish) == 7.0 and not publisher.stale
    refused = [r.levelno for r in caplog.records if "refuses this pool's writes" in r.getMessage()]
    assert refused == [logging.ERROR, logging.ERROR]  # once per streak, each streak
