"""Carries the controller's actions out on the actors, under link credits.

The transfer worker: foreground work (an engine waits) on its own threads, background
work (gap migrations, prefetches, refills, deletions) on others, each transfer under a
credit of its link (``link_credits.py``) and landing through reserved arena pages
(``landing.py``). A background move gives way to the foreground: one whose page an engine
now waits for leaves the background queue at once (a prefetch is promoted to foreground,
a gap migration is abandoned and the page stays in HBM), and a prefetch that holds HBM
room but has no credit yet gives that room back to a load blocked for room there.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from agentkv_cluster.runtime.actor_watch import DEATH_PING_S, Liveness, liveness
from agentkv_cluster.runtime.guard import Guarded, ServiceStopping
from agentkv_cluster.runtime.handles import ActorGone, ActorHandle
from agentkv_cluster.runtime.landing import LandingPages
from agentkv_cluster.runtime.link_credits import Abandoned, Link, LinkCredits
from agentkv_cluster.runtime.pool_tiers import NvmeTierFull
from agentkv_cluster.runtime.records import (
    Action,
    ActionKind,
    Outcome,
    Reason,
    TenantErased,
    TransferResult,
)
from security.errors import KeyUnavailable
from store.hbm import ArenaFull
from store.types import Codec, Tier

if TYPE_CHECKING:
    from agentkv_cluster.runtime.handles import HbmHandle, PoolHandle


@dataclass(slots=True)
class TierTraffic:
    """Bytes that crossed each link, by destination tier (the demo's "bytes per tier"), and
    pool copies written per codec."""

    by_tier: Counter[str] = field(default_factory=Counter)
    by_tenant_tier: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    by_tenant_codec: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def add(self, tenant: str, tier: str, n: int) -> None:
        self.by_tier[tier] += n
        self.by_tenant_tier[(tenant, tier)] += n

    def stored(self, tenant: str, tier: Tier, codec: Codec, n: int) -> None:
        """One copy of ``n`` bytes written to a pool tier in ``codec``'s form."""
        self.add(tenant, tier.name.lower(), n)
        self.by_tenant_codec[(tenant, codec.name.lower())] += 1

    def retire(self, tenant: str, into: str) -> None:
        """An erased tenant's counts move to ``into``'s (``RETIRED_TENANT``)."""
        for table in (self.by_tenant_tier, self.by_tenant_codec):
            for key in [k for k in list(table) if k[0] == tenant]:
                table[(into, key[1])] += table.pop(key)


class Executor:
    """The transfer worker: moves the bytes of the manager's actions under its link
    credits, through its landing pages, and reports each as a ``TransferResult``.
    Foreground work (``run``: an engine waits) is applied to the manager before ``run``
    returns; background work (``submit``: gap migrations, prefetches, refills, deletions)
    comes back through ``get_finished``, which the controller actor's loop drains
    (``on_finished`` wakes it). Each kind has its own threads, and a background move an
    engine wants before it started is handed back at once (``abandon_queued``)."""

    def __init__(self, controller: Guarded, hbms: dict[str, HbmHandle],
                 pools: dict[str, PoolHandle],
                 hbm_pool: dict[str, str], credits: LinkCredits, *,
                 landing_pages: int = 8, on_finished: Callable[[], None] = lambda: None
                 ) -> None:
        self.controller = controller
        self.hbms, self.pools, self.hbm_pool = hbms, pools, hbm_pool
        self.credits = credits
        self.traffic = TierTraffic()
        self.errors: deque[str] = deque(maxlen=50)
        # Two pools: an engine's restores never wait for a thread behind background moves
        # (which sit in their threads while they wait for a background credit).
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentkv-exec")
        self._bg = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentkv-bg")
        self._queued: dict[int, tuple[Future, Action]] = {}  # gid -> background, not started
        self._starving: Counter[str] = Counter()  # HBM actor -> loads blocked for room there
        self.gave_room = 0  # prefetches that gave their HBM room to a blocked load (stats)
        # (hbm, pool) -> the handles the HBM actor was last given
        self._told: dict[tuple[str, str], tuple[HbmHandle, PoolHandle]] = {}
        self._lock = threading.Lock()
        self.closed = False  # ``close`` ran: no new move starts (the service is stopping)
        self._finished: deque[TransferResult] = deque()
        self._on_finished = on_finished
        self.landing = LandingPages(f"executor-{uuid.uuid4().hex[:12]}", landing_pages,
                                    background=self._pool.submit)

    def set_credits(self, enabled: bool) -> None:
        """Fresh link credits, on or off (side-by-side herd runs)."""
        c = self.credits
        self.credits = LinkCredits(c.per_link, c.per_session, enabled=enabled)

    def submit(self, actions: list[Action]) -> None:
        """Start background work; its results come back through ``get_finished``. Once
        closed, nothing starts (the service is stopping)."""
        with self._lock:
            for a in actions:
                if self.closed:
                    return
                future = self._bg.submit(self._background, a)
                if a.kind is not ActionKind.DELETE:
                    self._queued[a.gid] = (future, a)

    def _background(self, action: Action) -> None:
        with self._lock:
            if self._queued.get(action.gid, (None, None))[1] is action:
                del self._queued[action.gid]
        self._finished.append(self._run(action))
        self._on_finished()

    def abandon_queued(self, gids: list[int]) -> int:
        """An engine waits for ``gids``: background moves of them that have not started
        yet (no thread, no credit) give way at once, and the manager hears so now (a
        queued prefetch leaves the page to the engine's own restore; a queued migration
        leaves it in HBM). Those waiting for their credit look now: a migration gives way,
        a prefetch is promoted to the foreground. Returns how many gave way."""
        given = self._abandon(lambda a: True, "wanted before it started", gids)
        self.credits.wake()
        return given

    @contextmanager
    def room_wanted(self, hbms: set[str]) -> Iterator[int]:
        """A load waits for room on ``hbms`` (blocked, all or nothing): while it waits,
        prefetches into them that hold their room but have no credit yet give it back
        (queued ones at once, waiting ones as soon as they look; see ``_restore``). A
        prefetch is a guess and the load is not. Yields how many queued ones gave way."""
        with self._lock:
            self._starving.update(hbms)
        try:
            self.credits.wake()
            given = self._abandon(self._gives_room, "its room is wanted by a load")
            with self._lock:
                self.gave_room += given
            yield given
        finally:
            with self._lock:
                self._starving.subtract(hbms)

    def _gives_room(self, a: Action) -> bool:
        """A prefetch gives its HBM room back: a load is blocked for room on its HBM actor
        and no engine waits for its page (a wanted page's prefetch is promoted instead)."""
        return (a.reason is Reason.PREFETCH and self._starving[a.hbm] > 0
                and not self.controller.demand.wanted(a.gid))

    def _abandon(self, match: Callable[[Action], bool], why: str,
                 gids: Iterable[int] | None = None) -> int:
        """Queued background moves (of ``gids``, or all) that ``match`` give way."""
        given_up = []
        with self._lock:
            for gid in set(self._queued if gids is None else gids):
                future, action = self._queued.get(gid, (None, None))
                if action is not None and match(action) and future.cancel():
                    del self._queued[gid]
                    given_up.append(TransferResult(action=action, outcome=Outcome.ABANDONED,
                                                   error=f"Abandoned: {why}", elapsed_s=0.0))
        now = time.monotonic()
        for result in given_up:
            self.submit(self.controller.finished(result, now))
        return len(given_up)

    def get_finished(self) -> list[TransferResult]:
        """Background transfers that ended since the last call (oldest first)."""
        out = []
        while self._finished:
            out.append(self._finished.popleft())
        return out

    def run(self, actions: list[Action]) -> list[TransferResult]:
        """Run foreground work and wait. Each result reaches the manager as soon as its
        transfer ends (a load waiting for one of these pages waits for that move alone,
        not for the whole batch), and all of them before this returns. Each restore starts
        as soon as the demotions that make its own room have copied their pages out (not
        after every victim of the batch, nor after the victims' drops, which free arena
        pages an allocation waits for anyway): restores pipeline behind the victims'
        encode-and-seal instead of queueing behind all of them. Once closed it refuses
        (``ServiceStopping``): the service is stopping, and its moves were cancelled."""
        copied = {a.gid: threading.Event() for a in actions if a.kind is not ActionKind.RESTORE}
        try:
            futures = [self._pool.submit(self._reported, [], a, copied[a.gid])
                       for a in actions if a.kind is not ActionKind.RESTORE]
            for a in actions:
                if a.kind is ActionKind.RESTORE:
                    deps = [copied[g] for g in self.controller.take_victims(a.gid)
                            if g in copied]
                    futures.append(self._pool.submit(self._reported, deps, a))
            return [f.result() for f in futures]
        except (RuntimeError, CancelledError):  # submitted after, or cancelled by, close
            if self.closed:
                raise ServiceStopping("the service is stopping; retry on another "
                                      "instance") from None
            raise

    def _reported(self, deps: list[threading.Event], action: Action,
                  copied: threading.Event | None = None) -> TransferResult:
        """``action`` once ``deps`` are set, its result handed to the manager at once;
        ``copied`` is set when a demotion no longer needs its page's bytes."""
        for event in deps:
            event.wait()
        try:
            result = self._run(action, copied)
        finally:
            if copied is not None:
                copied.set()
        self.submit(self.controller.finished(result, time.monotonic()))  # deletions, if any
        return result

    def _run(self, action: Action, copied: threading.Event | None = None) -> TransferResult:
        t0 = time.monotonic()
        outcome, error = Outcome.FAILED, ""
        try:
            if action.kind is not ActionKind.DELETE and self.controller.table.doomed(action.gid):
                raise TenantErased("the page's tenant is being erased")
            if action.kind is ActionKind.DEMOTE:
                done = self._demote(action, copied)
            elif action.kind is ActionKind.RESTORE:
                done = self._restore(action)
            else:
                self._delete(action)
                done = TransferResult(action=action, outcome=Outcome.DONE)
            return replace(done, elapsed_s=time.monotonic() - t0)
        except Abandoned as exc:  # not an error: the foreground path takes over
            outcome, error = Outcome.ABANDONED, f"Abandoned: {exc}"
        except TenantErased as exc:  # not an error: the erasure cancels the move
            outcome, error = Outcome.ERASED, f"TenantErased: {exc}"
        except (NvmeTierFull, ArenaFull) as exc:  # no room: the caller is refused as busy
            outcome, error = Outcome.NO_ROOM, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported to the controller and the caller
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ActorGone) or self._hbm_died(action):
                outcome = Outcome.ACTOR_GONE
            self.errors.append(f"{action.kind.value} {action.reason.value}: {error[:300]}")
        return TransferResult(action=action, outcome=outcome, error=error,
                              elapsed_s=time.monotonic() - t0)

    def _hbm_died(self, a: Action) -> bool:
        """A restore that failed otherwise is the dead HBM actor's when it was forgotten
        meanwhile (a ``KeyError`` here) or Ray says it died (a pool's push into a dead actor
        fails as a transfer error): the load restores the page elsewhere instead of refusing
        it. A local object cannot die."""
        if a.kind is not ActionKind.RESTORE:
            return False
        hbm = self.hbms.get(a.hbm)
        if hbm is None:
            return True
        return isinstance(hbm, ActorHandle) and hbm.remote \
            and liveness(hbm, DEATH_PING_S) is Liveness.GONE

    def _moot(self, gid: int) -> bool:
        """A background move gives way: its page is wanted now, retired, or its tenant
        erased."""
        table = self.controller.table
        return self.controller.demand.wanted(gid) or gid not in table.pages or table.doomed(gid)

    def _pool_for(self, rec_pool: str, hbm: str) -> str:
        """The name of the pool a move between ``hbm`` and it uses; the HBM actor gets the
        pool's handle once (again whenever either actor was replaced) and the moves carry
        the name, which pickles in microseconds where an actor handle takes ~0.4 ms."""
        name = rec_pool or self.hbm_pool[hbm]
        handles = (self.hbms[hbm], self.pools[name])
        told = self._told.get((hbm, name))
        if told is None or told[0] is not handles[0] or told[1] is not handles[1]:
            handles[0].add_pool(name, handles[1])
            self._told[(hbm, name)] = handles
        return name

    def _demote(self, a: Action, copied: threading.Event | None = None) -> TransferResult:
        try:
            rec = self.controller.table.record(a.gid)
        except KeyError:  # retired while queued: nothing to keep
            return TransferResult(action=a, outcome=Outcome.DONE)
        targets = []
        # Pages are immutable: a pool copy at least as precise as the one asked for (or as
        # the working copy, when that was restored lossy) already holds all it could, and
        # a copy of a lossy working copy is no more precise than it (never labelled FULL).
        best = max(a.codec, rec.resident_codec)
        if rec.copy_for(best) is None:
            targets.append((int(a.tier), int(best)))
        if a.reference and rec.resident_codec is Codec.FULL and Codec.FULL not in rec.copies:
            targets.append((int(Tier.NVME), int(Codec.FULL)))
        name = self._pool_for(rec.pool, a.hbm)
        hbm = self.hbms[a.hbm]
        copies: tuple[tuple[int, int], ...] = ()
        sizes: tuple[int, ...] = ()
        if targets:
            gap = a.reason is Reason.GAP  # background work on the link HBM actor -> pool
            link = Link(name, a.hbm, background=True)
            grant = self.credits.acquire(a.session, link, give_up=lambda: self._moot(a.gid),
                                         tier=Tier(a.tier)) if gap else None
            try:
                receipt = hbm.demote(rec.meta, targets, name, False)
                copies, sizes = receipt.copies, receipt.tier_bytes
            except KeyUnavailable:
                # No key to seal under: every generation of the page's tenant was erased.
                # Kept in HBM it would overcommit the budget its room went to, so it goes
                # with no copy (its load is page_lost: the engine re-prefills).
                if a.keep:
                    raise
                self.errors.append(f"demote {a.reason.value}: a page of {rec.meta.namespace} "
                                   "dropped: no key generation left to seal it under")
            finally:
                if gap:
                    self.credits.release(link, grant)
        # The HBM copy is dropped only now: a load that wanted the page while it was moving
        # out took it back (no wait for the copy, no restore of a page that never left).
        if not a.keep and not self.controller.keep_if_room(a.gid, time.monotonic()):
            if copied is not None:  # a restore waiting for this room goes on meanwhile
                copied.set()
            hbm.drop(rec.meta.key)
        for (tier, codec), n in zip(copies, sizes):
            self.traffic.stored(rec.meta.tenant, Tier(tier), Codec(codec), n)
        return TransferResult(action=a, outcome=Outcome.DONE, pool=name, tier_bytes=tuple(sizes),
                              copies=tuple((Tier(t), Codec(c)) for t, c in copies))

    def _restore(self, a: Action) -> TransferResult:
        rec = self.controller.table.record(a.gid)
        name = self._pool_for(rec.pool, a.hbm)
        link = Link(name, a.hbm)
        if a.reason is Reason.PREFETCH:
            try:
                background = link.as_background()
                grant = self.credits.acquire(
                    a.session, background,
                    give_up=lambda: self._moot(a.gid) or self._gives_room(a))
                link = background
            except Abandoned:
                if self.controller.table.doomed(a.gid):
                    raise TenantErased("the page's tenant is being erased") from None
                if a.gid not in self.controller.table.pages:  # retired: nothing to restore
                    raise
                if not self.controller.demand.wanted(a.gid):  # it gave its room to a load
                    with self._lock:
                        self.gave_room += 1
                    raise
                grant = self.credits.acquire(a.session, link)  # wanted: promote to foreground
        else:
            grant = self.credits.acquire(a.session, link)
        try:
            receipt = self.landing.restore(a.hbm, self.hbms[a.hbm], self.pools[name], name,
                                           rec.meta, int(a.tier), int(a.codec))
        finally:
            self.credits.release(link, grant)
        self.traffic.add(rec.meta.tenant, "hbm", receipt.link_bytes)
        source = Tier(receipt.tier).name.lower()
        if self.hbm_pool.get(a.hbm) != name:
            source = "remote"
        return TransferResult(action=a, outcome=Outcome.DONE, source=source, exact=receipt.exact)

    def _delete(self, a: Action) -> None:
        """A retired page: drop its HBM copy; its pool copies too unless another HBM shares it
        (even when the HBM actor failed: the pool's copies and directory entry would stay)."""
        hbm = self.hbms.get(a.hbm)
        try:
            if hbm is not None:
                hbm.drop(a.key)
        finally:
            if a.reason is not Reason.SHARED and a.pool in self.pools:
                self.pools[a.pool].delete(a.key, a.tenant)

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._bg.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.landing.release()
