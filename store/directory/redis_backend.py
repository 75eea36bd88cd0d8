"""RedisDirectory: the directory on a real redis-server (redis is imported here and in
``redis_errors`` only).

Key layout, one namespace per tenant (or tenant prefix family)::

    {prefix}:{<ns>}:meta          hash  gen, sealed
    {prefix}:{<ns>}:e:<hexkey>    msgpack [tier, node, location, codec, size_bucket, gen]
    {prefix}:{<ns>}:r:<hexkey>    reference count
    {prefix}:{<ns>}:g:<gen>       set of hex keys in that generation
    {prefix}:{<ns>}:gens          set of generations that have entries (and maybe the current one)
    {prefix}:{<ns>}:w:<node>      entries of that node written (counted by each put)

``delete_namespace`` (tenant erasure) removes all of them, first adding the namespace to
``{prefix}:{<TOMBSTONES>}:erased`` (sorted set, score an erasure sequence number, never a
time; the newest ``ERASED_KEEP`` stay). An erased tenant's blinded name cannot be linked to
it: its blinding secret was shredded with its keys.

The braces are literal: a Redis Cluster hash tag, so a namespace's keys share a slot and
its scripts stay single-slot; an ACL key pattern ``~akv:{<ns>}:*`` confines a tenant's
user to its namespace. Changes run as Lua scripts.

Lost writes: each ``put`` gets back its node's write count in the namespace, and the
client keeps the highest one (its *mark*). A server that comes back from an older
snapshot, or emptied, has a lower count than the mark: ``lost_writes`` (and the next
``put``, whose count is not above the mark) tells the caller, who republishes. A
namespace with a tombstone was erased on purpose: its marks are forgotten, never reported.

Erasure races: every script that may write a namespace's keys (an entry; ``meta`` when it
opens, advances, seals or lifts a generation) reads the tombstone in the same round trip,
after the script. The erasure adds the tombstone before it deletes, so a write either ran
before the deletion or finds the tombstone and deletes the namespace again itself (on one
server; a Redis Cluster may run the two on different shards in any order). Erased,
``open_generation`` answers the generation it opened (taken back), ``current_generation``
0; refusals (``MissingEntry``...) are raised as usual.

Refused writes (``WritesRefused``, a class per reason, mapped in ``redis_errors``): at
``maxmemory`` (``DirectoryFull``) reads and deletions still work; a replica
(``ReadOnlyReplica``) or failing persistence (``PersistenceFailing``) allows reads only,
so no erasure either. ``check_writes`` asks without writing; ``server_run_id`` changes at
every restart (a snapshot loaded then may hold namespaces erased since it was taken).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import redis
from redis import exceptions as rexc

from store.directory import _lua
from store.directory.base import (
    ERASED_KEEP,
    DirectoryEntry,
    DirectoryError,
    DirectoryFull,
    InvalidEntry,
    UnknownGeneration,
    check_key,
    check_namespace,
)
from store.directory.redis_errors import as_directory_error
from store.directory.redis_errors import call as _call
from store.types import Codec, Lookup, Tier

_BATCH = 1000  # keys per MGET in get_many, per SCAN step and DEL in delete_namespace
_ERASE_ROUNDS = 8
TOMBSTONES = "n" + "0" * 23 + "e"  # reserved, like the watch's marker namespace "n000..0"


class RedisDirectory:
    def __init__(self, url: str, prefix: str = "akv", *, socket_timeout_s: float = 5.0) -> None:
        check_namespace(prefix)
        self.prefix = prefix
        self._client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )
        self._scripts = {
            name: self._client.register_script(getattr(_lua, name))
            for name in ("PUT", "ADJUST", "DELETE", "OPEN", "SEAL", "ADVANCE", "STATE", "PRUNE",
                         "TOMBSTONE")
        }
        self._floor: dict[str, int] = {}  # highest generation seen per namespace
        self._marks: dict[tuple[str, str], int] = {}  # (ns, node) -> highest write count
        self._lost: set[str] = set()  # namespaces a put found behind, until ``lost_writes``
        self._marks_lock = threading.Lock()
        self._erased = f"{prefix}:{{{TOMBSTONES}}}:erased"  # namespaces erased on purpose
        self._tombstones = True  # False once refused: a tenant's ACL user sees only its own
        self._probe = f"{prefix}:{{{TOMBSTONES}}}:write-probe"  # never exists (check_writes)

    # ------------------------------------------------------------------ keys
    def _base(self, ns: str) -> str:
        check_namespace(ns)
        return f"{self.prefix}:{{{ns}}}:"

    def _entry_keys(self, ns: str, key: bytes) -> tuple[str, str, str]:
        check_key(key)
        base, hexkey = self._base(ns), key.hex()
        return f"{base}e:{hexkey}", f"{base}r:{hexkey}", hexkey

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return _call(lambda: self._scripts[name](keys=keys, args=args))

    def _write(self, name: str, keys: list[str], args: list[Any], ns: str, *,
               quiet_if_erased: bool = False) -> tuple[Any, bool]:
        """Script ``name``, then in the same round trip: has ``ns`` a tombstone? If so, what
        it wrote is taken back (the namespace dropped again and forgotten here); its refusal
        is raised all the same unless ``quiet_if_erased``."""
        script = self._scripts[name]

        def run() -> tuple[Any, bool]:
            for _ in range(2):  # a restarted server lost its scripts: load, then once more
                pipe = self._client.pipeline(transaction=False)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                if self._tombstones:
                    pipe.zscore(self._erased, ns)
                result, *erased = pipe.execute(raise_on_error=False)
                if not isinstance(result, rexc.NoScriptError):
                    break
                self._client.script_load(script.script)
            gone = self._tombstone(erased[0] if erased else None)
            if isinstance(result, Exception) and not gone:
                raise result
            return result, gone

        result, gone = _call(run)
        if gone:
            self._forget(ns)
            self._drop(ns)
            if isinstance(result, Exception) and not quiet_if_erased:
                raise as_directory_error(result)
        return result, gone

    def _tombstone(self, score: Any) -> bool:
        """Whether a tombstone read found one; a refused read (a tenant's ACL user, removed
        by an erasure before the namespace) stops this client reading them."""
        if isinstance(score, rexc.NoPermissionError):
            self._tombstones = False
            return False
        if isinstance(score, Exception):
            raise score
        return score is not None

    def _forget(self, ns: str) -> None:
        """Drop this client's generation floor, write marks and loss flag of ``ns``."""
        with self._marks_lock:
            self._floor.pop(ns, None)
            self._lost.discard(ns)
            for mark in [m for m in self._marks if m[0] == ns]:
                del self._marks[mark]

    def _seen(self, ns: str, generation: int) -> int:
        self._floor[ns] = max(generation, self._floor.get(ns, 0))
        return generation

    # ------------------------------------------------------------------ entries
    def put(self, entry: DirectoryEntry) -> None:
        self._put(entry, restore=False)

    def _put(self, entry: DirectoryEntry, restore: bool) -> bool:
        """Write ``entry``; False if its namespace turned out erased (the write taken back)."""
        if not isinstance(entry, DirectoryEntry):
            raise InvalidEntry(f"expected a DirectoryEntry, got {type(entry).__name__}")
        ns = entry.tenant_ns
        base = self._base(ns)
        ekey, rkey, hexkey = self._entry_keys(ns, entry.key)
        packed = msgpack.packb([int(entry.tier), entry.node, entry.location, int(entry.codec),
                                entry.size_bucket, entry.generation])
        mark = (ns, entry.node)
        with self._marks_lock:
            sent = self._marks.get(mark, 0)
        result, erased = self._write(
            "PUT",
            [f"{base}meta", ekey, rkey, f"{base}g:{entry.generation}", f"{base}gens",
             f"{base}w:{entry.node}"],
            [entry.generation, packed, hexkey, self._floor.get(ns, 0), f"{base}g:",
             0 if restore else entry.refcount, int(restore)],
            ns,
            quiet_if_erased=True,
        )
        if erased:  # the namespace was erased meanwhile: the write was taken back
            return False
        cur, written = result
        self._seen(ns, int(cur))
        with self._marks_lock:  # counts only go up: one not above the mark was lost
            if int(written) <= sent:
                self._lost.add(ns)
            if int(written) <= sent or int(written) > self._marks.get(mark, 0):
                self._marks[mark] = int(written)
        return True

    def lost_writes(self) -> list[str]:
        """Namespaces whose writes by this client the server lost since the last call (an
        older snapshot, or empty): to republish, each told once. One round trip (counts and
        tombstones); an erased namespace is forgotten, not reported."""
        with self._marks_lock:
            marks = dict(self._marks)
            names = sorted({ns for ns, _ in marks} | self._lost)
        if not names:
            return []

        def read() -> tuple[list[Any], set[str]]:
            pipe = self._client.pipeline(transaction=False)
            for ns, node in marks:
                pipe.get(f"{self._base(ns)}w:{node}")
            for ns in names if self._tombstones else ():
                pipe.zscore(self._erased, ns)
            replies = pipe.execute(raise_on_error=False)
            if errors := [r for r in replies[:len(marks)] if isinstance(r, Exception)]:
                raise errors[0]
            return replies[:len(marks)], {ns for ns, score in zip(names, replies[len(marks):])
                                          if self._tombstone(score)}

        counts, erased = _call(read)
        with self._marks_lock:
            lost, self._lost = self._lost, set()
            for (mark, sent), count in zip(marks.items(), counts):
                if int(count or 0) < sent:
                    lost.add(mark[0])
                    if self._marks.get(mark) == sent:
                        self._marks[mark] = int(count or 0)
        for ns in erased:
            self._forget(ns)
        return sorted(lost - erased)

    def get(self, namespace: str, key: bytes) -> tuple[Lookup, DirectoryEntry | None]:
        return self.get_many(namespace, [key])[0]

    def get_many(
        self, namespace: str, keys: Sequence[bytes]
    ) -> list[tuple[Lookup, DirectoryEntry | None]]:
        names: list[str] = []
        for key in keys:
            ekey, rkey, _ = self._entry_keys(namespace, key)
            names += (ekey, rkey)
        out: list[tuple[Lookup, DirectoryEntry | None]] = []
        for i in range(0, len(names), 2 * _BATCH):
            values = _call(lambda i=i: self._client.mget(names[i : i + 2 * _BATCH]))
            for j in range(0, len(values), 2):
                raw, ref = values[j], values[j + 1]
                if raw is None:
                    out.append((Lookup.MISS, None))
                else:
                    out.append((Lookup.HIT, _decode(namespace, keys[(i + j) // 2], raw, ref)))
        return out

    def delete(self, namespace: str, key: bytes) -> Lookup:
        ekey, rkey, hexkey = self._entry_keys(namespace, key)
        base = self._base(namespace)
        gone = self._run("DELETE", [ekey, rkey, f"{base}meta", f"{base}gens"],
                         [hexkey, f"{base}g:"])
        return Lookup.HIT if int(gone) else Lookup.MISS

    def incref(self, namespace: str, key: bytes) -> int:
        return self._adjust(namespace, key, +1)

    def decref(self, namespace: str, key: bytes) -> int:
        return self._adjust(namespace, key, -1)

    def _adjust(self, namespace: str, key: bytes, delta: int) -> int:
        ekey, rkey, _ = self._entry_keys(namespace, key)
        meta = f"{self._base(namespace)}meta"  # lifted to the floor: may write it
        count, _erased = self._write("ADJUST", [meta, ekey, rkey],
                                     [delta, self._floor.get(namespace, 0)], namespace)
        return int(count)

    # ------------------------------------------------------------------ generations
    def open_generation(self, namespace: str) -> int:
        base = self._base(namespace)
        gen, erased = self._write("OPEN", [f"{base}meta", f"{base}gens"],
                                  [self._floor.get(namespace, 0), f"{base}g:"], namespace)
        return int(gen) if erased else self._seen(namespace, int(gen))

    def _state(self, namespace: str) -> tuple[int, bool]:
        meta = f"{self._base(namespace)}meta"  # lifted to the floor: may write it
        (cur, sealed), erased = self._write("STATE", [meta], [self._floor.get(namespace, 0)],
                                            namespace)
        if erased:
            return 0, False
        return self._seen(namespace, int(cur)), bool(int(sealed))

    def current_generation(self, namespace: str) -> int:
        return self._state(namespace)[0]

    def seal_generation(self, namespace: str, generation: int) -> None:
        meta = f"{self._base(namespace)}meta"
        cur, erased = self._write("SEAL", [meta], [generation, self._floor.get(namespace, 0)],
                                  namespace)
        if not erased:
            self._seen(namespace, int(cur))

    def advance_generation(self, namespace: str, generation: int) -> None:
        base = self._base(namespace)
        gen, erased = self._write("ADVANCE", [f"{base}meta", f"{base}gens"],
                                  [generation, self._floor.get(namespace, 0), f"{base}g:"],
                                  namespace)
        if not erased:
            self._seen(namespace, int(gen))

    def check_writes(self) -> None:
        """``WritesRefused`` if Redis refuses writes now (out of memory, a replica, failing
        persistence), without writing: ``SET ... XX`` of a key that never exists is refused
        before Redis looks at the key, as every write is, and changes nothing if accepted."""
        _call(lambda: self._client.set(self._probe, b"", xx=True))

    def held_namespaces(self, namespaces: Sequence[str]) -> list[str]:
        """Those of ``namespaces`` whose ``meta`` or generation set exists (one round trip)."""
        pipe = self._client.pipeline(transaction=False)
        for base in [self._base(ns) for ns in namespaces]:  # every name checked first
            pipe.exists(f"{base}meta", f"{base}gens")
        return [ns for ns, n in zip(namespaces, _call(pipe.execute)) if n]

    def server_run_id(self) -> str:  # drawn anew at every start (module doc)
        return str(_call(lambda: self._client.info("server")).get("run_id", ""))

    def restore(self, entries: Sequence[DirectoryEntry]) -> None:
        current: dict[str, int] = {}
        erased: set[str] = set()  # none of their entries: erased (before or meanwhile)
        for entry in entries:  # validate all first: nothing changes on a bad batch
            ns = entry.tenant_ns
            if ns not in current:
                current[ns] = self.current_generation(ns)
            if entry.generation > current[ns] and ns not in erased:
                if not self._tombstone(_call(lambda n=ns: self._client.zscore(self._erased, n))
                                       if self._tombstones else None):
                    raise UnknownGeneration(f"{ns} has no generation {entry.generation}")
                erased.add(ns)
        for entry in entries:
            if entry.tenant_ns not in erased and not self._put(entry, restore=True):
                erased.add(entry.tenant_ns)  # erased meanwhile: none of its entries

    def reclaimable(self, namespace: str) -> list[DirectoryEntry]:
        cur, sealed = self._state(namespace)
        base = self._base(namespace)
        gens = sorted(int(g) for g in _call(lambda: self._client.smembers(f"{base}gens")))
        found: list[DirectoryEntry] = []
        for gen in gens:
            if gen > cur or (gen == cur and not sealed):
                continue
            members = sorted(_call(lambda g=gen: self._client.smembers(f"{base}g:{g}")))
            if not members:  # listed yet empty (an older version's scripts): drop it now
                self._run("PRUNE", [f"{base}meta", f"{base}gens"], [gen, f"{base}g:"])
            keys = [bytes.fromhex(m.decode()) for m in members]
            for _lookup, entry in self.get_many(namespace, keys):
                if entry is not None and entry.refcount == 0 and entry.generation == gen:
                    found.append(entry)
        return found

    def delete_namespace(self, namespace: str) -> int:
        """Erasure: no key of ``namespace`` left (entries whatever their references, counts,
        generation sets, ``meta``, ``w:<node>``); the number of entries removed. The
        tombstone first (module doc); then the keys, listed with SCAN (a tenant's ACL user
        may not) and deleted until a SCAN finds none (DirectoryError after ``_ERASE_ROUNDS``)."""
        self._base(namespace)  # a bad name is refused before anything is written
        self._forget(namespace)
        if self._tombstone_for(namespace):
            return self._drop(namespace)
        removed = self._drop(namespace)  # refused (out of memory): deleting frees some
        if self._tombstone_for(namespace):
            removed += self._drop(namespace)  # what raced in before the tombstone
        return removed

    def _tombstone_for(self, namespace: str) -> bool:
        """Add ``namespace``'s tombstone; False if Redis refused the write for memory (an
        erasure then stands without it, and its writers report a loss once). Any other
        refusal is raised: a replica, or a server that cannot persist, deletes nothing."""
        try:
            self._run("TOMBSTONE", [self._erased], [namespace, ERASED_KEEP])
        except DirectoryFull:  # deletions still work there
            return False
        return True

    def _drop(self, namespace: str) -> int:
        """Delete every key of ``namespace`` (module doc of ``delete_namespace``)."""
        base = self._base(namespace)
        removed = 0
        for _ in range(_ERASE_ROUNDS):
            keys = _call(lambda: list(self._client.scan_iter(match=f"{base}*", count=_BATCH)))
            if not keys:
                return removed
            removed += sum(k.startswith(f"{base}e:".encode()) for k in keys)
            for i in range(0, len(keys), _BATCH):
                batch = keys[i:i + _BATCH]
                _call(lambda b=batch: self._client.delete(*b))
        raise DirectoryError(f"namespace {namespace} still written to after "
                             f"{_ERASE_ROUNDS} rounds of deletion")

    def close(self) -> None:
        self._client.close()


def _decode(ns: str, key: bytes, raw: bytes, ref: bytes | None) -> DirectoryEntry:
    tier, node, location, codec, bucket, gen = msgpack.unpackb(raw)
    return DirectoryEntry(key=key, tenant_ns=ns, tier=Tier(tier), node=node, location=location,
                          codec=Codec(codec), size_bucket=bucket, generation=gen,
                          refcount=int(ref or 0))

