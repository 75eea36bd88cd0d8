"""The controller actor: the ``Controller`` bookkeeping, an ``Executor`` and a reconcile loop.

Every engine call and orchestrator event of the API front lands here; the loop starts
scheduled gap migrations and prefetches when due. Bytes never pass through this actor."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from agentkv_cluster.lifecycle.events import EventValidationError, TaskEnd
from agentkv_cluster.runtime.actor_watch import ActorWatch
from agentkv_cluster.runtime.controller import Controller, HbmFull
from agentkv_cluster.runtime.directory_glue import held_elsewhere
from agentkv_cluster.runtime.erasure_receipts import ControllerErased
from agentkv_cluster.runtime.event_planner import AuditSummary, SessionClosed
from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import Guarded
from agentkv_cluster.runtime.handles import HbmHandle, PoolHandle
from agentkv_cluster.runtime.idle_sessions import IdleSessions
from agentkv_cluster.runtime.link_credits import LinkCredits
from agentkv_cluster.runtime.loads import EngineLoader
from agentkv_cluster.runtime.mover import RemoteSpan
from agentkv_cluster.runtime.records import (
    RETIRED_TENANT,
    ActionKind,
    LoadReport,
    MetricsSince,
    Outcome,
    PageMeta,
    PoolHolding,
    RefusedNotFound,
    RequestRefused,
    TenantErased,
    TransferResult,
    UnknownPageKey,
    UnknownSession,
)
from agentkv_cluster.runtime.stores import EngineStorer, Stored
from agentkv_cluster.runtime.strategies import Learned, make_strategy
from store.types import Codec, Tier


@dataclass(frozen=True, kw_only=True)
class ControllerSpec:
    policy: str = "agentkv"
    per_link: int = 4
    per_session: int = 2
    credits: bool = True
    tick_s: float = 0.01
    landing_pages: int = 8  # per HBM actor, for one-hop restores (as its HbmSpec says)
    page_bytes: int = 0  # arena page size: the HBM budget counts whole pages (0: bytes)
    pin_timeout_s: float = 30.0  # a load's pins are dropped if not released by then
    host_bytes: int = 0  # each pool's host tier (the placement's capacity; 0: unbounded)
    nvme_bytes: int = 0  # each pool's NVMe shard
    learned: Learned | None = None  # what an earlier controller of this policy learned
    idle_session_s: float = 86400.0  # an open session unused this long is closed (0: never)


class ControllerActor:
    def __init__(self, spec: ControllerSpec, directory: Any = None) -> None:
        self.spec = spec
        capacity = {Tier.HOST: spec.host_bytes, Tier.NVME: spec.nvme_bytes} \
            if spec.host_bytes and spec.nvme_bytes else None
        strategy = make_strategy(spec.policy, spec.learned)
        self.controller = Guarded(Controller(strategy, spec.page_bytes, capacity))
        self.hbms: dict[str, HbmHandle] = {}
        self.pools: dict[str, PoolHandle] = {}
        self._wake = threading.Event()  # a background transfer finished
        self.executor = Executor(  # pairs HBM actors with pools as the page table does
            self.controller, self.hbms, self.pools, self.controller.table.hbm_pool,
            LinkCredits(spec.per_link, spec.per_session, enabled=spec.credits),
            landing_pages=spec.landing_pages, on_finished=self._wake.set)
        self.directory = directory
        self.loader = EngineLoader(self.controller, self.executor, self._check)
        self.storer = EngineStorer(self.controller, self.executor, self.hbms, self._check,
                                   self.remove_hbm)
        self._restarting: set[str] = set()
        self.idle = IdleSessions(spec.idle_session_s)
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._reconcile, name="agentkv-reconcile", daemon=True)
        self._loop.start()
        self._health = ActorWatch(self.hbms, self.pools, self._restarting, stop=self._stop,
                                  hbm_gone=self.remove_hbm, pool_gone=self._forget_pool).start()

    def ping(self) -> str:
        return "controller"

    # -- topology -------------------------------------------------------------------------
    def add_pool(self, name: str, handle: PoolHandle) -> None:
        self.pools[name] = handle

    def add_hbm(self, name: str, handle: HbmHandle, capacity: int, pool: str) -> None:
        self.hbms[name] = handle
        self.controller.add_hbm(name, capacity, pool)

    def remove_hbm(self, name: str) -> int:
        """The HBM actor died: its copies are gone; returns how many pages had no other copy."""
        self.hbms.pop(name, None)
        return len(self.controller.remove_hbm(name))

    def set_credits(self, enabled: bool) -> None:
        """Turn link credits on or off (fresh counters); for side-by-side herd runs."""
        self.executor.set_credits(enabled)

    def expect_restart(self, name: str) -> None:
        """A pool actor is being replaced on purpose: keep its copies (it rebuilds them)."""
        self._restarting.add(name)

    def replace_pool(self, name: str, handle: PoolHandle) -> None:
        self.pools[name] = handle
        self._restarting.discard(name)

    # -- reconcile loop --------------------------------------------------------------------
    def _reconcile(self) -> None:
        """The actor's loop: finished background transfers go to the page manager, the
        moves it has due go to the transfer worker, pins never released expire."""
        expire_at = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            finished = self.executor.get_finished()
            for result in finished:  # and what a move left of a page retired meanwhile
                self.executor.submit(self.controller.finished(result, now))
            self._check(finished)
            if now >= expire_at:  # pins of loads never released, sessions abandoned
                self.controller.table.expire_held(now, self.spec.pin_timeout_s)
                self.idle.sweep(now, lambda t, s: self.close_session(t, s).closed)
                expire_at = now + 1.0
            nxt = self.controller.schedule.next_due()
            if nxt is None or nxt > now:
                self._wake.wait(min(self.spec.tick_s, max(0.0, (nxt or now + 1) - now)))
                self._wake.clear()
                continue
            self.executor.submit(self.controller.due(now))

    def _forget_pool(self, name: str) -> None:
        self.pools.pop(name, None)
        self.controller.remove_pool(name, sorted(self.pools))  # its HBM actors: another

    def topology(self) -> dict[str, list[str]]:
        return {"hbms": sorted(self.hbms), "pools": sorted(self.pools)}

    def serve_exact(self, tenant: str, session: str, key: bytes, dst: RemoteSpan) -> bool:
        """Push the FULL reference copy of a page (if any) into ``dst``: a lossy working
        copy is verified against / replaced by it when the engine needs exact bytes."""
        (gid,) = self.controller.table.resolve(tenant, session, [key])
        rec = self.controller.table.record(gid)
        if Codec.FULL not in rec.copies or rec.pool not in self.pools:
            return False
        got = self.pools[rec.pool].restore_to(rec.meta.key, rec.meta.digest, int(Codec.FULL),
                                              dst.wire())
        # The verification fetch of a lossy restore is traffic of the policy that chose the
        # lossy form: counted like any other move (tier "verify").
        self.executor.traffic.add(rec.meta.tenant, "verify", got.nbytes)
        return True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self.controller.stop()  # waiting loads and stores end now (``ServiceStopping``)
        self.executor.close()

    # -- engine and orchestrator calls -----------------------------------------------------
    def open_session(self, tenant: str, session: str) -> str:
        try:
            hbm = self.controller.table.open_session(tenant, session)
        except HbmFull as exc:
            raise RequestRefused(str(exc)) from None
        self.idle.touch(tenant, session, time.monotonic())
        return hbm

    def close_session(self, tenant: str, session: str) -> SessionClosed:
        """``EventPlanner.close_session``; its deletions run in the background."""
        closed, deletions = self.controller.events.close_session(tenant, session,
                                                                 time.monotonic())
        self.idle.forget(tenant, session)
        self.executor.submit(deletions)
        return closed

    def store(self, tenant: str, session: str, metas: list[PageMeta],
              spans: list[RemoteSpan], after: Stored | None = None) -> Stored:
        """``EngineStorer.store``: the HBM actors that took the pages' bytes."""
        took = self.storer.store(tenant, session, metas, spans, after)
        self.idle.touch(tenant, session, time.monotonic())
        return took

    def _check(self, results: list[TransferResult]) -> bool:
        """A move failed as an actor died: the dead HBM actors and pools go now, so a load's
        retry restores elsewhere (a slow actor is the watcher's to judge). True when a
        move found no room (a pool full on every tier, or the arena)."""
        if any(r.outcome is Outcome.ACTOR_GONE for r in results):
            self._health.forget_dead()
        return any(r.outcome is Outcome.NO_ROOM for r in results)

    def event(self, tenant: str, session: str, data: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        try:
            event = self.controller.events.translate(tenant, session, data)
            actions = self.controller.apply(event, now)
        except (UnknownSession, UnknownPageKey) as exc:
            raise RefusedNotFound(f"{type(exc).__name__}: {exc}") from None
        except EventValidationError as exc:
            raise RequestRefused(f"{type(exc).__name__}: {exc}") from None
        self.executor.submit(actions)
        if isinstance(event, TaskEnd):  # the session's task is over: so are its pins
            self.controller.table.release_held(tenant, session, None, now)
        self.idle.touch(tenant, session, now)
        return {"kind": event.kind.value, "actions": len(actions),
                "retired": sum(a.kind is ActionKind.DELETE for a in actions)}

    def load(self, tenant: str, session: str, keys: list[bytes], public_read: bool
             ) -> list[LoadReport]:
        """Pin ``keys`` in HBM (restoring what is missing; PUBLIC pages if ``public_read``);
        a load that runs while its tenant is erased fails with ``TenantErased``."""
        epoch = self.controller.table.erasures[tenant]
        try:
            reports = self.loader.load(tenant, session, keys, public_read)
        except (KeyError, RequestRefused) as exc:
            if self.controller.erased_since(tenant, epoch):
                raise TenantErased("the tenant was erased during this load") from None
            if isinstance(exc, RequestRefused):
                raise
            known = isinstance(exc, (UnknownSession, UnknownPageKey))
            raise (RefusedNotFound if known else RequestRefused)(
                f"{type(exc).__name__}: {exc}") from None
        if self.controller.erased_since(tenant, epoch):
            raise TenantErased("the tenant was erased during this load")
        self.idle.touch(tenant, session, time.monotonic())
        return reports

    def release(self, tenant: str, session: str, keys: list[bytes]) -> int:
        try:
            gids = self.controller.table.resolve(tenant, session, keys)
        except (UnknownSession, UnknownPageKey) as exc:
            raise RefusedNotFound(str(exc)) from None
        now = time.monotonic()
        self.controller.table.release_held(tenant, session, gids, now)
        self.idle.touch(tenant, session, now)
        return len(gids)

    def hbm_of(self, tenant: str, session: str) -> str:
        try:
            hbm = self.controller.table.hbm_of(tenant, session)
        except UnknownSession as exc:
            raise RefusedNotFound(str(exc)) from None
        self.idle.touch(tenant, session, time.monotonic())
        return hbm

    # -- prefix sharing --------------------------------------------------------------------
    def lookup(self, tenant: str, session: str, metas: list[PageMeta], namespaces: list[str]
               ) -> int:
        """Length of the leading run of ``metas`` the cluster holds: in this session's HBM,
        or found through the directory on any pool (then adopted with its copies). From the
        first page not held here on, the rest are looked up at once (a read per namespace,
        a ``holds_many`` per pool). Copies a deletion is on its way to are not held."""
        hbm = self.hbm_of(tenant, session)
        elsewhere: dict[int, tuple[str, PoolHolding]] | None = None
        for n, meta in enumerate(metas):
            if self.controller.table.share(meta, hbm):  # held in this session's HBM
                continue
            if elsewhere is None:
                elsewhere = held_elsewhere(self.directory, self.pools, metas[n:], namespaces[n:], n)
            found = elsewhere.get(n)
            if found is None:
                return n
            node, held = found
            copies = {codec: tier for tier, codec in held.copies}
            meta = replace(meta, length=held.length, state_type=held.state_type,
                           shape=held.shape, structured=meta.structured or held.structured)
            (adopted, _), = self.controller.admit(tenant, session, [meta], time.monotonic(),
                                                  copies={meta.key: copies}, pool=node)[0]
            if not adopted:  # those copies are being deleted with the page that made them
                return n
        return len(metas)

    # -- tenant erasure ------------------------------------------------------------------------
    def freeze_tenant(self, tenant: str) -> None:
        """The erasure's first step: ``tenant``'s calls fail from now on (see erase_tenant)."""
        self.controller.table.begin_erase(tenant)

    def thaw_tenant(self, tenant: str) -> None:
        """An erasure that could not start (no keys): the tenant's calls work again."""
        self.controller.table.end_erase(tenant)

    def erase_tenant(self, tenant: str) -> ControllerErased:
        """Tenant erasure across the controller and every HBM actor, as one step: refuse
        the tenant's calls, cancel its moves (loads in flight fail with ``TenantErased``),
        forget its pages, pins and sessions; each HBM actor zeroes its pages, free pages,
        staging slots and landing stock. Raises if one is unreachable (a failed tier)."""
        try:
            gone = self.controller.forget_tenant(tenant, wake=self.executor.credits.wake)
            self.idle.forget_tenant(tenant)
            purged = [handle.purge(gone.keys.get(name, []))
                      for name, handle in list(self.hbms.items())]
            stocked = self.executor.landing.release()  # after: no refill holds old bytes
            zeroed = sum(p.free_zeroed for p in purged) + stocked
            self._retire_counts(tenant)
            return ControllerErased(forgotten=replace(gone, keys={}),
                                    hbm_pages=sum(p.pages for p in purged),
                                    hbm_free_zeroed=zeroed, hbm_actors=len(purged))
        finally:
            self.controller.table.end_erase(tenant)

    def _retire_counts(self, tenant: str) -> None:
        """The erased tenant's cumulative metric counts join ``RETIRED_TENANT``'s: the
        counters stay whole, and the tenant's name is neither kept nor sent on each scrape
        (these tables grew by every tenant ever served)."""
        self.executor.traffic.retire(tenant, RETIRED_TENANT)
        tokens = self.loader.recompute_tokens
        if tenant in tokens:
            tokens[RETIRED_TENANT] = tokens.get(RETIRED_TENANT, 0) + tokens.pop(tenant)

    def copies_erased(self, pool: str, tenant: str, copies: list[tuple[bytes, int]]) -> int:
        """A key generation's erasure overwrote ``copies`` ((key, codec)) of ``tenant``'s pages
        on ``pool``: its pages lose them (a lookup counts none left with no copy). Returns
        how many pages that left with none."""
        return len(self.controller.table.drop_copies(pool, tenant, copies))

    # -- stats --------------------------------------------------------------------------------
    def metrics_since(self, cursor: int) -> MetricsSince:
        """For the metrics exporter: credit waits after ``cursor`` (at most 10,000; fresh
        credits restart it), load phases since the last call, HBM in use, per-tenant counts."""
        end, waits = self.executor.credits.waits_since(cursor)
        hbm = sum(self.controller.table.hbm_used().values())
        traffic = {k: v for k, v in self.executor.traffic.by_tenant_tier.items()
                   if k[1] != "hbm"}  # bytes into HBM are counted by the API front
        phases = [self.loader.unexported.popleft() for _ in range(len(self.loader.unexported))]
        return MetricsSince(cursor=end, waits=_wait_labels(waits), phases=phases, hbm_used=hbm,
                            recompute=dict(self.loader.recompute_tokens), traffic=traffic,
                            codecs=dict(self.executor.traffic.by_tenant_codec),
                            gave_room=self.executor.gave_room)

    def learned(self) -> Learned | None:
        """What this controller's strategy learned (for its successor)."""
        with self.controller.cv:
            return self.controller.strategy.learned()

    def drain_audit(self) -> list[AuditSummary]:
        """Audited pages' summaries retired since the last call (for the service's audit log)."""
        return self.controller.events.drain_audit()

    def stats(self) -> dict[str, Any]:
        c = self.controller
        with c.cv:
            occupancy = c.table.hbm_used()
            pages = len(c.table.pages)
            predictor = c.strategy.calibration()
            counters = dict(c.stats)
        return {"controller": counters, "pages": pages, "hbm_used": occupancy,
                "predictor": predictor, "traffic": dict(self.executor.traffic.by_tier),
                "max_in_flight": {str(link): n for link, n  # copied first: threads add links
                                  in dict(self.executor.credits.max_in_flight).items()},
                "credit_waits": _wait_labels(self.executor.credits.waits_since(0)[1]),
                "load_phases": list(self.loader.phases),
                "prefetches_gave_room": self.executor.gave_room,
                "sessions_idle_closed": self.idle.expired,
                "errors": list(self.executor.errors)}


def _wait_labels(waits: list[tuple[Tier, float]]) -> list[tuple[str, float]]:
    """Credit waits as (tier label, seconds): the labels metrics show ("hbm", "host", ...)."""
    return [(tier.name.lower(), seconds) for tier, seconds in waits]
