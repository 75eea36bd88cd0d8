"""The directory glue, pure (a scripted backend, local handles, no Redis, no Ray): the
guard's backoff is capped and starts over after a recovery (a second outage is tried
again after ``first_s``, not after the delay the first one had grown to), and
``held_elsewhere`` numbers its answers from ``first`` across namespaces, as the
controller's prefix lookup reads them (``metas[n:]`` with ``first=n``)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.directory_glue import (
    Backoff,
    GuardedDirectory,
    RedisSpec,
    held_elsewhere,
    open_directory,
)
from agentkv_cluster.runtime.handles import DirectoryHandle, PoolHandle
from agentkv_cluster.runtime.records import PageMeta, PoolHolding
from store.directory.base import DirectoryEntry, DirectoryUnavailable
from store.types import Codec, Lookup, Tier
from tests.unit.service.test_controller import meta

NS_A = "n" + "a" * 24
NS_B = "n" + "b" * 24


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Backend:
    """A directory backend that is down while ``down`` is set (each call is counted)."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def current_generation(self, namespace: str) -> int:
        self.calls += 1
        if self.down:
            raise DirectoryUnavailable("connection refused")
        return 1


def _fail(d: GuardedDirectory) -> None:
    with pytest.raises(DirectoryUnavailable):
        d.current_generation(NS_A)


def test_the_backoff_doubles_up_to_its_cap_and_stays_there() -> None:
    b = Backoff(first_s=0.5, max_s=3.0)
    delays = [b.after(None)]
    for _ in range(5):
        delays.append(b.after(delays[-1]))
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_a_second_outage_starts_again_from_the_first_delay() -> None:
    clock, backend = Clock(), _Backend()
    d = GuardedDirectory(backend, Backoff(first_s=1.0, max_s=8.0), clock)
    backend.down = True
    _fail(d)  # next attempt at 1
    clock.now = 1.0
    _fail(d)  # at 3
    clock.now = 3.0
    _fail(d)  # at 7: the delay has grown to 4 s
    assert d._next_try == pytest.approx(7.0)
    backend.down = False
    clock.now = 7.0
    assert d.current_generation(NS_A) == 1 and d.available
    backend.down = True
    clock.now = 10.0
    _fail(d)  # a new outage: tried again 1 s later, not 8 s later
    assert d._next_try == pytest.approx(11.0)
    calls = backend.calls
    clock.now = 11.0
    _fail(d)
    assert backend.calls == calls + 1  # a real attempt once the first delay has passed


def test_the_outage_is_timed_from_its_first_failure(caplog) -> None:
    clock, backend = Clock(), _Backend()
    d = GuardedDirectory(backend, Backoff(first_s=1.0, max_s=8.0), clock)
    caplog.set_level(logging.ERROR, logger="agentkv_cluster.runtime.directory_glue")
    backend.down = True
    clock.now = 10.0
    _fail(d)
    clock.now = 11.0
    _fail(d)
    clock.now = 13.0
    _fail(d)
    clock.now = 14.0
    with pytest.raises(DirectoryUnavailable, match="unreachable for 4.0 s"):
        d.current_generation(NS_A)  # inside the delay: refused at once
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == [
        "directory unreachable for 0.0 s", "directory unreachable for 1.0 s",
        "directory unreachable for 3.0 s"]


class _Shell:
    """The directory's actor: ``entries`` (namespace, key) -> entry are what it finds."""

    def __init__(self, entries: dict[tuple[str, bytes], DirectoryEntry]) -> None:
        self.entries = entries

    def get_many(self, namespace: str, keys: list[bytes]) -> list:
        return [(Lookup.HIT, self.entries[(namespace, k)]) if (namespace, k) in self.entries
                else (Lookup.MISS, None) for k in keys]


class _Pool:
    """A pool that holds ``held`` (one host copy each)."""

    def __init__(self, held: set[bytes]) -> None:
        self.held = held

    def holds_many(self, keys: list[bytes]) -> list:
        holding = PoolHolding(copies=((Tier.HOST, Codec.FULL),), length=1 << 20,
                              state_type=StateType.EVIDENCE, shape=None)
        return [holding.wire() if k in self.held else None for k in keys]


def _meta(i: int) -> PageMeta:
    return replace(meta("s", i), key=bytes([i]) * 32)


def _entry(ns: str, key: bytes, node: str) -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=ns, tier=Tier.HOST, node=node,
                          location="pool:1", codec=Codec.FULL, size_bucket=0, generation=1)


def test_pages_held_elsewhere_are_numbered_from_first_across_namespaces() -> None:
    metas = [_meta(i) for i in range(5)]
    namespaces = [NS_A, NS_A, NS_B, NS_A, NS_B]
    shell = _Shell({(NS_A, metas[1].key): _entry(NS_A, metas[1].key, "node1"),
                    (NS_B, metas[2].key): _entry(NS_B, metas[2].key, "node2"),
                    (NS_A, metas[3].key): _entry(NS_A, metas[3].key, "node1"),
                    # the right key in the wrong namespace is no hit
                    (NS_A, metas[4].key): _entry(NS_A, metas[4].key, "node2")})
    directory = DirectoryHandle.local(shell, "directory")
    pools = {"node1": PoolHandle.local(_Pool({metas[1].key, metas[3].key}), "node1"),
             "node2": PoolHandle.local(_Pool({metas[2].key, metas[4].key}), "node2")}
    n = 1  # the controller asks for the pages after the n it found locally
    found = held_elsewhere(directory, pools, metas[n:], namespaces[n:], n)
    assert {i: node for i, (node, _) in found.items()} == {1: "node1", 2: "node2", 3: "node1"}
    assert all(h.copies == ((Tier.HOST, Codec.FULL),) for _, h in found.values())


def test_an_actors_guard_tries_a_dead_redis_again_within_five_seconds() -> None:
    """``open_directory`` (what every actor uses) waits at most 5 s between attempts,
    however long Redis has been down (docs: 0.5 s doubling up to 5 s)."""
    clock = Clock()
    d = open_directory(RedisSpec(url="redis://127.0.0.1:1/0"))  # nothing listens there
    d.clock = clock
    try:
        delays = []
        for _ in range(8):
            _fail(d)
            delays.append(d._next_try - clock.now)
            clock.now = d._next_try
        assert delays[0] == pytest.approx(0.5) and max(delays) == pytest.approx(5.0)
    finally:
        d.close()
