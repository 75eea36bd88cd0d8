"""An engine load on the controller actor: wait, pin all or nothing, restore, report.

``EngineLoader`` is the one place that turns ``load(keys)`` into page reports: it waits
(in the guard) until the pages stop moving, pins them all or none, has the executor run
the demotions and restores the page manager planned, retries once when an actor died
mid-restore, and reports per page where the bytes came from and how long the engine
waited. Pages with no copy left are refused (the engine re-prefills) and counted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from agentkv_cluster.runtime.executor import Executor
from agentkv_cluster.runtime.guard import LOAD_WAIT_S, Guarded
from agentkv_cluster.runtime.records import (
    ActionKind,
    LoadPhases,
    LoadReport,
    Outcome,
    RefusedNotFound,
    RequestRefused,
    TransferResult,
    UnknownPageKey,
    UnknownSession,
)
from store.types import Codec


class EngineLoader:
    def __init__(self, controller: Guarded, executor: Executor,
                 check: Callable[[list[TransferResult]], None]) -> None:
        """``check`` looks at failed results for dead actors (the actor removes them)."""
        self.controller = controller
        self.executor = executor
        self.check = check
        self.recompute_tokens: dict[str, int] = {}  # tenant -> tokens of pages lost for good
        self.phases: deque[LoadPhases] = deque(maxlen=10_000)  # the latest loads (stats)
        self.unexported: deque[LoadPhases] = deque(maxlen=10_000)  # not yet in metrics

    def load(self, tenant: str, session: str, keys: list[bytes]) -> list[LoadReport]:
        t0 = time.monotonic()
        try:
            gids = self.controller.table.resolve(tenant, session, keys)
        except (UnknownSession, UnknownPageKey) as exc:
            raise RefusedNotFound(str(exc)) from None
        before = {g: self.controller.table.record(g) for g in gids}
        was_resident = {g: r.resident and not r.busy for g, r in before.items()}
        # Wanted for the whole load: background moves of these pages give way (a queued
        # one at once, one waiting for its credit as soon as it looks), a prefetch in
        # flight is promoted to the foreground.
        phases = LoadPhases(pages=len(gids))
        self.controller.table.want(gids, 1)
        try:
            self.executor.abandon_queued(gids)
            for attempt in range(2):
                by_gid = self._bring_in(gids, phases)
                failed = [g for g, r in by_gid.items() if not r.ok]
                if not failed:
                    break
                self.controller.table.unpin(gids, time.monotonic())
                gone = any(by_gid[g].outcome is Outcome.ACTOR_GONE for g in failed)
                if attempt or not gone:
                    raise RequestRefused(f"{len(failed)} page(s) could not be restored: "
                                         f"{by_gid[failed[0]].error}")
        finally:
            self.controller.table.want(gids, -1)
        total = time.monotonic() - t0
        phases.total_s, phases.restored = total, len(by_gid)
        self.phases.append(phases)
        self.unexported.append(phases)
        self.controller.table.hold(tenant, session, gids, time.monotonic())
        return [self._report(g, was_resident[g], by_gid.get(g), total) for g in gids]

    def _bring_in(self, gids: list[int], phases: LoadPhases) -> dict[int, TransferResult]:
        """Pin ``gids`` and restore the missing ones; returns restore results by gid.
        Adds the time of each step to ``phases``."""
        results: list[TransferResult] = []
        deadline = time.monotonic() + 45.0
        waited_for_room = False  # the first plan waits for pages moving out, later ones for room
        while True:
            t = time.monotonic()
            demotes, restores, lost, blocked = self.controller.access_settled(gids,
                                                                             time.monotonic)
            planned = time.monotonic()
            if waited_for_room:
                phases.blocked_s += planned - t
            else:
                phases.settle_s += planned - t
            results += self.executor.run(demotes + restores)
            phases.transfer_s += time.monotonic() - planned
            pinned = [g for g in gids if g not in lost and g not in blocked]
            if lost:
                self._count_recompute(lost)
                self.controller.table.unpin(pinned, time.monotonic())
                raise RequestRefused(f"PageLost: {len(lost)} page(s) have no copy left; "
                                     "re-prefill them")
            if not blocked:
                # Pages that were on their way in (a prefetch, another load's restore) are
                # pinned as they are; their transfers ran alongside this load's own.
                t = time.monotonic()
                self.controller.wait_arrived(gids, LOAD_WAIT_S)
                phases.arrival_s += time.monotonic() - t
                own = {r.action.gid for r in results if r.action.kind is ActionKind.RESTORE}
                late = [g for g in gids if g not in own
                        and not self.controller.table.record(g).resident]
                if not late:
                    break
                # such a transfer failed (its page left HBM): restore those pages here
                self.controller.table.unpin(gids, time.monotonic())
                if time.monotonic() > deadline:
                    raise RequestRefused(f"{len(late)} page(s) did not arrive in HBM")
                continue
            # All or nothing: holding some pins while waiting for room deadlocks a herd.
            seen = self.controller.table.unpin(pinned, time.monotonic())
            if time.monotonic() > deadline:
                raise RequestRefused("HBM is full of pinned pages; release some and retry")
            t = time.monotonic()
            short = {self.controller.table.record(g).hbm for g in blocked}
            with self.executor.room_wanted(short):  # prefetches there give their room back
                self.controller.wait_changed(seen, 0.05)  # a pin dropped or a move ended
            phases.blocked_s += time.monotonic() - t
            waited_for_room = True
        self.check(results)
        return {r.action.gid: r for r in results if r.action.kind is ActionKind.RESTORE}

    def _count_recompute(self, lost: list[int]) -> None:
        """The engine re-prefills lost pages: count their tokens per tenant (metrics)."""
        for gid in lost:
            try:
                meta = self.controller.table.record(gid).meta
            except KeyError:
                continue
            self.recompute_tokens[meta.tenant] = \
                self.recompute_tokens.get(meta.tenant, 0) + meta.tokens

    def _report(self, gid: int, hit: bool, result: TransferResult | None, total: float
                ) -> LoadReport:
        """The engine waited ``total`` for every page it did not find in HBM; a prefetch's
        time is hidden only where the load did not wait for it."""
        rec = self.controller.table.record(gid)
        if result is not None:
            source, delay, hidden = result.source, total, 0.0
        else:
            source, delay = "hbm", 0.0 if hit else total
            hidden, rec.hidden_s = max(0.0, rec.hidden_s - delay), 0.0
        return LoadReport(key=rec.meta.key, source=source, delay_s=delay, hidden_s=hidden,
                          exact=rec.resident_codec is Codec.FULL, codec=rec.resident_codec,
                          nbytes=rec.meta.length, hbm=rec.hbm)
