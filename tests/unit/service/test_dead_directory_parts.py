"""Dead actors on the directory's side, pure (local handles stand in for the actors, no
Ray): ``/readyz`` is not ready while the embedded directory's actor is dead or silent, and
a prefix lookup that the directory points at a pool this controller forgot (it died)
finds nothing there instead of failing on it."""

from __future__ import annotations

from dataclasses import replace

from agentkv_cluster.runtime.directory_glue import held_elsewhere
from agentkv_cluster.runtime.directory_watch import probe, ready
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow, DirectoryHandle, PoolHandle
from agentkv_cluster.runtime.records import PageMeta
from store.directory.base import DirectoryEntry
from store.types import Codec, Lookup, Tier
from tests.unit.service.test_controller import meta

NS = "n" + "1" * 24


class _Shell:
    """The embedded directory's actor: answers its ping, or fails it as a dead (``gone``)
    or hung one would; ``entries`` are what ``get_many`` finds."""

    def __init__(self, fault: ActorGone | None = None,
                 entries: dict[bytes, DirectoryEntry] | None = None) -> None:
        self.fault, self.entries = fault, entries or {}

    def ping(self) -> str:
        if self.fault is not None:
            raise self.fault
        return "directory"

    def get_many(self, namespace: str, keys: list[bytes]) -> list:
        return [(Lookup.HIT, self.entries[k]) if k in self.entries else (Lookup.MISS, None)
                for k in keys]


class _Pool:
    """A live pool that no longer holds what it is asked for (it records the asking)."""

    def __init__(self) -> None:
        self.asked: list[list[bytes]] = []

    def holds_many(self, keys: list[bytes]) -> list[None]:
        self.asked.append(list(keys))
        return [None] * len(keys)


def test_a_dead_or_silent_directory_actor_is_not_ready() -> None:
    alive = DirectoryHandle.local(_Shell(), "directory")
    dead = DirectoryHandle.local(_Shell(ActorGone("directory: RayActorError")), "directory")
    hung = DirectoryHandle.local(_Shell(ActorSlow("directory: no answer in 2 s")), "directory")
    assert probe(alive) == (True, "directory ok")
    assert probe(dead) == (False, "directory actor unreachable")
    assert probe(hung, 2.0) == (False, "directory actor: no answer within 2 s")
    assert ready(dead, None) == (False, "directory actor unreachable")


def _meta(i: int) -> PageMeta:
    return replace(meta("s", i), key=bytes([i]) * 32)


def _entry(key: bytes, node: str) -> DirectoryEntry:
    return DirectoryEntry(key=key, tenant_ns=NS, tier=Tier.HOST, node=node,
                          location="pool:1", codec=Codec.FULL, size_bucket=0, generation=1)


def test_an_entry_on_a_forgotten_pool_is_found_nowhere() -> None:
    metas = [_meta(1), _meta(2)]
    live = _Pool()
    shell = _Shell(entries={metas[0].key: _entry(metas[0].key, "node1"),  # died: forgotten
                            metas[1].key: _entry(metas[1].key, "node0")})
    directory = DirectoryHandle.local(shell, "directory")
    pools = {"node0": PoolHandle.local(live, "node0")}
    assert held_elsewhere(directory, pools, metas, [NS, NS]) == {}
    assert live.asked == [[metas[1].key]]  # the live pool was asked for its own entry only
