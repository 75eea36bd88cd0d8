"""Handles: the only way the service calls its actors, and every ``.remote()`` and
``ray.get`` of it.

``ActorHandle`` is the machinery: it calls methods of a Ray actor or, in local mode
(tests, tools), of a plain object; a dead actor surfaces as ``ActorGone``, an exception
raised inside the actor is re-raised as itself, and ``handle.options(timeout_s=...)``
gives another answer timeout. It has no catch-all: each actor kind has a typed subclass
below (``PoolHandle``, ``HbmHandle``, ``ControllerHandle``, ``DirectoryHandle``, in the
style of Ray Serve's ``DeploymentHandle``) whose methods carry the actor method's name,
parameters and return types, so a misspelt method is an ``AttributeError`` where it is
called, not a failure inside the actor. ``tests/unit/service/test_handles.py`` checks
every method against its actor class.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from agentkv_cluster.runtime.records import (
    DemoteReceipt,
    PoolHolding,
    PoolReceipt,
    RestoreReceipt,
)

if TYPE_CHECKING:
    from agentkv_cluster.runtime.erasure_receipts import ControllerErased, HbmPurged, PoolPurged
    from agentkv_cluster.runtime.event_planner import AuditSummary, SessionClosed
    from agentkv_cluster.runtime.mover import Endpoint, RemoteSpan
    from agentkv_cluster.runtime.records import LoadReport, MetricsSince, PageMeta
    from agentkv_cluster.runtime.stores import Stored
    from agentkv_cluster.runtime.strategies import Learned
    from store.directory.base import DirectoryEntry
    from store.types import Codec, Lookup, Tier


DEFAULT_TIMEOUT_S = 120.0  # how long a call waits for its answer unless ``options`` says
CREATE_TIMEOUT_S = 300.0  # how long ``create`` waits for the actor to be constructed


class ActorGone(Exception):
    """The actor behind a handle died or cannot be reached."""


class ActorSlow(ActorGone):
    """No answer within the call's timeout, or the actor unreachable for now: it may be
    alive and busy, and still move bytes through spans the call lent it
    (``actor_watch`` forgets one only after several missed pings)."""


class ActorHandle:
    """A picklable reference to an actor (or a local object) plus its service name."""

    def __init__(self, target: Any, name: str, *, remote: bool,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self.name = name
        self.remote = remote
        self.timeout_s = timeout_s

    @classmethod
    def create(cls, remote_cls: Any, name: str, options: dict[str, Any],
               *args: Any) -> Self:
        """Start an actor from a class made remote by ``wiring``; waits until it is
        constructed (its ``ping`` answers)."""
        actor = remote_cls.options(**options).remote(*args)
        handle = cls(actor, name, remote=True)
        handle.options(timeout_s=CREATE_TIMEOUT_S).ping()
        return handle

    @classmethod
    def local(cls, obj: Any, name: str) -> Self:
        """A handle on a plain object in this process (no Ray): same calls, same errors."""
        return cls(obj, name, remote=False)

    def options(self, *, timeout_s: float | None) -> Self:
        """This handle with another answer timeout (None: wait as long as it takes)."""
        other = copy.copy(self)
        other.timeout_s = timeout_s
        return other

    # -- the machinery the typed methods delegate to -------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        if not self.remote:
            return getattr(self.target, method)(*args)
        return self._get(getattr(self.target, method).remote(*args), self.timeout_s)

    def _start(self, method: str, *args: Any) -> Callable[[], Any]:
        """Send a call now and return a function that waits for its result (or raises what
        ``_call`` would): the caller overlaps the call with other work."""
        if not self.remote:
            try:
                value = getattr(self.target, method)(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the waiter, as remotely
                error = exc

                def fail() -> Any:
                    raise error

                return fail
            return lambda: value
        return functools.partial(self._get, getattr(self.target, method).remote(*args),
                                 self.timeout_s)

    def _get(self, ref: Any, timeout_s: float | None) -> Any:
        import ray
        from ray import exceptions as rex

        try:
            return ray.get(ref, timeout=timeout_s)
        except rex.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None  # the actor's own exception, message intact
            raise exc.as_instanceof_cause() from None
        except rex.ActorUnavailableError as exc:  # unreachable, not known dead
            raise ActorSlow(f"{self.name}: {type(exc).__name__}") from None
        except rex.RayActorError as exc:
            raise ActorGone(f"{self.name}: {_why_gone(exc)}") from None
        except rex.GetTimeoutError as exc:
            raise ActorSlow(f"{self.name}: no answer in {timeout_s} s") from exc

    # -- what every actor answers -----------------------------------------------------------
    def ping(self) -> str:
        return self._call("ping")

    def kill(self) -> None:
        """Fault injection and shutdown: end the actor process now."""
        if self.remote:
            import ray

            ray.kill(self.target, no_restart=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, remote={self.remote})"

class PoolHandle(ActorHandle):
    """A node's memory-pool actor (``pool_actor.PoolActor``; ``wiring.PoolShell`` on Ray)."""

    def endpoint(self) -> Endpoint:
        return self._call("endpoint")

    def introduce(self, endpoint: Endpoint) -> None:
        self._call("introduce", endpoint)

    def node_id(self) -> str:
        """The Ray node the actor runs on (Ray only: ``PoolShell``)."""
        return self._call("node_id")

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def holds_many(self, keys: list[bytes]) -> list[PoolHolding | None]:
        return [None if w is None else PoolHolding.from_wire(w)
                for w in self._call("holds_many", keys)]

    def store_from(self, meta: PageMeta, tier: Tier, codec: Codec, src: RemoteSpan
                   ) -> PoolReceipt:
        return PoolReceipt.from_wire(self._call("store_from", meta, tier, codec, src))

    def restore_to(self, key: bytes, digest: bytes, codec: int, dst: tuple) -> PoolReceipt:
        return PoolReceipt.from_wire(self._call("restore_to", key, digest, codec, dst))

    def probe_link(self, dst: RemoteSpan) -> int:
        return self._call("probe_link", dst)

    def delete_copy(self, key: bytes, codec: Codec) -> bool:
        return self._call("delete_copy", key, codec)

    def delete(self, key: bytes, namespace: str) -> int:
        return self._call("delete", key, namespace)

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        return self._call("purge_tenant", tenant, generation)

    def tenants_held(self) -> list[str]:
        return self._call("tenants_held")

    def republish(self) -> int:
        return self._call("republish")

    def reset(self) -> int:
        return self._call("reset")

    def close(self, unlink: bool = True) -> None:
        self._call("close", unlink)


class HbmHandle(ActorHandle):
    """An HBM page actor (``hbm_actor.HbmActor``), one per GPU or ``hbm_slot``."""

    def endpoint(self) -> Endpoint:
        return self._call("endpoint")

    def introduce(self, endpoint: Endpoint) -> None:
        self._call("introduce", endpoint)

    def add_pool(self, name: str, pool: PoolHandle) -> None:
        self._call("add_pool", name, pool)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def keys(self) -> list[bytes]:
        return self._call("keys")

    def ingest(self, key: bytes, src: RemoteSpan) -> int:
        return self._call("ingest", key, src)

    def span(self, key: bytes) -> RemoteSpan:
        return self._call("span", key)

    def serve(self, keys: list[bytes], dsts: list[RemoteSpan]) -> int:
        return self._call("serve", keys, dsts)

    def start_serve(self, keys: list[bytes], dsts: list[RemoteSpan]) -> Callable[[], int]:
        """``serve`` sent now; the returned function waits for it (or raises what it raised)."""
        return self._start("serve", keys, dsts)

    def drop(self, key: bytes, scrub: bool = False) -> bool:
        return self._call("drop", key, scrub)

    def erase(self, keys: list[bytes]) -> int:
        return self._call("erase", keys)

    def purge(self, keys: list[bytes]) -> HbmPurged:
        return self._call("purge", keys)

    def arena_holds(self, needles: list[bytes]) -> list[bool]:
        return self._call("arena_holds", needles)

    def reset(self) -> int:
        return self._call("reset")

    def reserve(self, n: int, owner: str) -> list[tuple[int, tuple]]:
        return self._call("reserve", n, owner)

    def land(self, key: bytes, page: int, length: int, owner: str) -> None:
        self._call("land", key, page, length, owner)

    def start_land(self, key: bytes, page: int, length: int, owner: str
                   ) -> Callable[[], None]:
        """``land`` sent now; the returned function waits for it (or raises what it raised)."""
        return self._start("land", key, page, length, owner)

    def hold(self, key: bytes, expires: float, page: int, owner: str) -> bool:
        return self._call("hold", key, expires, page, owner)

    def release_landing(self, pages: list[int], owner: str) -> int:
        return self._call("release_landing", pages, owner)

    def read(self, key: bytes) -> bytes:
        return self._call("read", key)

    def demote(self, meta: PageMeta, targets: list[tuple[int, int]], pool: PoolHandle | str,
               drop: bool = True) -> DemoteReceipt:
        return DemoteReceipt.from_wire(self._call("demote", meta, targets, pool, drop))

    def restore(self, meta: PageMeta, tier: int, codec: int, pool: PoolHandle | str
                ) -> RestoreReceipt:
        return RestoreReceipt.from_wire(self._call("restore", meta, tier, codec, pool))

    def close(self) -> None:
        self._call("close")


class ControllerHandle(ActorHandle):
    """The controller actor (``controller_actor.ControllerActor``)."""

    def add_pool(self, name: str, handle: PoolHandle) -> None:
        self._call("add_pool", name, handle)

    def add_hbm(self, name: str, handle: HbmHandle, capacity: int, pool: str) -> None:
        self._call("add_hbm", name, handle, capacity, pool)

    def remove_hbm(self, name: str) -> int:
        return self._call("remove_hbm", name)

    def set_credits(self, enabled: bool) -> None:
        self._call("set_credits", enabled)

    def expect_restart(self, name: str) -> None:
        self._call("expect_restart", name)

    def replace_pool(self, name: str, handle: PoolHandle) -> None:
        self._call("replace_pool", name, handle)

    def topology(self) -> dict[str, list[str]]:
        return self._call("topology")

    def open_session(self, tenant: str, session: str) -> str:
        return self._call("open_session", tenant, session)

    def close_session(self, tenant: str, session: str) -> SessionClosed:
        return self._call("close_session", tenant, session)

    def store(self, tenant: str, session: str, metas: list[PageMeta],
              spans: list[RemoteSpan], after: Stored | None = None) -> Stored:
        return self._call("store", tenant, session, metas, spans, after)

    def event(self, tenant: str, session: str, data: dict[str, Any]) -> dict[str, Any]:
        return self._call("event", tenant, session, data)

    def load(self, tenant: str, session: str, keys: list[bytes], public_read: bool
             ) -> list[LoadReport]:
        return self._call("load", tenant, session, keys, public_read)

    def serve_exact(self, tenant: str, session: str, key: bytes, dst: RemoteSpan) -> bool:
        return self._call("serve_exact", tenant, session, key, dst)

    def release(self, tenant: str, session: str, keys: list[bytes]) -> int:
        return self._call("release", tenant, session, keys)

    def hbm_of(self, tenant: str, session: str) -> str:
        return self._call("hbm_of", tenant, session)

    def lookup(self, tenant: str, session: str, metas: list[PageMeta],
               namespaces: list[str]) -> int:
        return self._call("lookup", tenant, session, metas, namespaces)

    def freeze_tenant(self, tenant: str) -> None:
        self._call("freeze_tenant", tenant)

    def thaw_tenant(self, tenant: str) -> None:
        self._call("thaw_tenant", tenant)

    def erase_tenant(self, tenant: str) -> ControllerErased:
        return self._call("erase_tenant", tenant)

    def copies_erased(self, pool: str, tenant: str, copies: list[tuple[bytes, int]]) -> int:
        return self._call("copies_erased", pool, tenant, copies)

    def metrics_since(self, cursor: int) -> MetricsSince:
        return self._call("metrics_since", cursor)

    def drain_audit(self) -> list[AuditSummary]:
        return self._call("drain_audit")

    def learned(self) -> Learned | None:
        return self._call("learned")

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        self._call("close")


class DirectoryHandle(ActorHandle):
    """The embedded directory in its own actor (``directory_glue.DirectoryShell``); a
    Redis directory is opened in each process instead (``directory_glue.open_directory``)."""

    def put(self, entry: DirectoryEntry) -> None:
        self._call("put", entry)

    def get(self, namespace: str, key: bytes) -> tuple[Lookup, DirectoryEntry | None]:
        return self._call("get", namespace, key)

    def get_many(self, namespace: str, keys: Sequence[bytes]
                 ) -> list[tuple[Lookup, DirectoryEntry | None]]:
        return self._call("get_many", namespace, keys)

    def delete(self, namespace: str, key: bytes) -> Lookup:
        return self._call("delete", namespace, key)

    def open_generation(self, namespace: str) -> int:
        return self._call("open_generation", namespace)

    def current_generation(self, namespace: str) -> int:
        return self._call("current_generation", namespace)

    def advance_generation(self, namespace: str, generation: int) -> None:
        self._call("advance_generation", namespace, generation)

    def restore(self, entries: list[DirectoryEntry]) -> None:
        self._call("restore", entries)

    def delete_namespace(self, namespace: str) -> int:
        return self._call("delete_namespace", namespace)


def _why_gone(exc: Exception) -> str:
    """The actor's death as one line: for one whose start failed, the error its
    ``__init__`` raised (the last line of the traceback Ray keeps as text): a pool that
    /dev/shm cannot hold said only "ActorDiedError" after a minute, the cause in a log."""
    if getattr(exc, "actor_init_failed", False):
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if lines:
            return f"{type(exc).__name__}: its start failed: {lines[-1][:300]}"
    return type(exc).__name__
