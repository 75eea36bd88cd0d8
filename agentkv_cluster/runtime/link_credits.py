"""Link credits: how many transfers each link (pool -> HBM actor) carries at once.

Restores take one credit of their link from a ``CreditManager`` (the pure policy object,
count-based here: one credit = one transfer in flight), so a restore storm waits in the
delay queue, served round-robin over sessions.

Each session has its own bucket on a link (``SessionKey``: two tenants' sessions of one
name are two sessions), for as long as it has a transfer there: an idle session's bucket
is full again (every credit came back), so it is dropped, losing nothing. Closed sessions
and sessions that simply stop leave no bucket behind.

Two credit classes share each link: foreground (an engine waits: on-demand restores)
and background (gap migrations, prefetches). Background work is admitted only while no
foreground transfer waits on the link, and a background request gives way (``Abandoned``)
as soon as its ``give_up`` says so: the transfer worker (``executor.py``) then promotes a
prefetch whose page an engine waits for, abandons a gap migration (the page stays in
HBM), and hands a prefetch's HBM room back to a load blocked for room.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from agentkv_cluster.lifecycle.types import SessionKey
from agentkv_cluster.policy.credits import (
    BucketSpec,
    CreditConfig,
    CreditGrant,
    CreditManager,
    CreditOutcome,
    CreditRequest,
    Resource,
)
from store.types import Tier

_BACKGROUND_SUFFIX = "/bg"  # the label form metrics and logs have always shown
WAITS_KEPT = 10_000  # the newest credit waits kept for metrics and stats (one per transfer)


@dataclass(frozen=True, slots=True)
class Link:
    """The link between pool ``pool`` and HBM actor ``hbm`` (moves in both directions share
    its credits), in one of two credit classes: foreground (an engine waits: on-demand
    restores) or background (gap migrations, prefetches). The two classes are separate
    credit buckets of the same link.

    ``str(link)`` is the label metrics and logs show: ``"pool>hbm"``, plus ``"/bg"`` for
    the background class."""

    pool: str
    hbm: str
    background: bool = False

    @property
    def foreground(self) -> Link:
        """The foreground class of the same link."""
        return Link(self.pool, self.hbm) if self.background else self

    def as_background(self) -> Link:
        """The background class of the same link."""
        return self if self.background else Link(self.pool, self.hbm, background=True)

    def __str__(self) -> str:
        return f"{self.pool}>{self.hbm}{_BACKGROUND_SUFFIX if self.background else ''}"


class Abandoned(Exception):
    """A background move gave way: the engine needs its page now, or (a prefetch) a load
    needs the room it holds."""


class LinkCredits:
    """Blocking front of ``CreditManager``: at most ``per_link`` transfers per link at once.

    A waiting request looks again whenever a credit is released or ``wake`` is called (a
    load wants its page, or its room), and every ``poll_s`` besides (credit pacing)."""

    poll_s = 0.02

    def __init__(self, per_link: int, per_session: int, enabled: bool = True) -> None:
        self.per_link, self.per_session, self.enabled = per_link, per_session, enabled
        self._managers: dict[Link, CreditManager] = {}  # one per link and credit class
        # Requests and grants per link and session: its bucket there goes at zero.
        self._users: Counter[tuple[Link, SessionKey | None]] = Counter()
        self._granted: dict[tuple[Link, int], CreditGrant] = {}  # tickets are per link
        self._cv = threading.Condition()
        self.in_flight: Counter[Link] = Counter()
        self.waiting: Counter[Link] = Counter()  # foreground requests queued per link
        self.max_in_flight: Counter[Link] = Counter()
        # (destination tier, seconds waited), the newest WAITS_KEPT: every transfer adds
        # one, so a list of them all grew for as long as the service ran
        self.waits: deque[tuple[Tier, float]] = deque(maxlen=WAITS_KEPT)
        self.waits_total = 0  # waits ever recorded (the cursor of ``waits_since``)

    def _manager(self, link: Link) -> CreditManager:
        mgr = self._managers.get(link)
        if mgr is None:
            # Background work (prefetch) gets its own, narrower class of the link so it never
            # queues an engine's on-demand restore behind it.
            cap = max(1, self.per_link // 4) if link.background else self.per_link
            mgr = CreditManager(CreditConfig(
                buckets={(Resource.LINK, str(link)): BucketSpec(capacity=cap)},
                # work-conserving: one session's load may use the whole link while no
                # other session waits for it (the per-session cap shares, never idles)
                session={Resource.LINK: BucketSpec(capacity=self.per_session, borrow=True)}))
            self._managers[link] = mgr
        return mgr

    def acquire(self, session: SessionKey | None, link: Link, timeout_s: float = 60.0,
                give_up: Callable[[], bool] | None = None, tier: Tier = Tier.HBM
                ) -> CreditGrant | None:
        """Block for one credit of ``link`` for ``session`` (a move into ``tier``, for the
        wait metrics); a background request (``link.background``) raises ``Abandoned`` as
        soon as ``give_up()`` says so (before it queues, and each time it wakes)."""
        t0 = time.monotonic()
        with self._cv:
            if self.enabled:
                self._users[(link, session)] += 1
                try:
                    grant = self._wait_grant(session, link, t0, timeout_s, give_up)
                except BaseException:
                    self._let_go(link, session)
                    raise
            else:
                grant = None
            self.in_flight[link] += 1
            self.max_in_flight[link] = max(self.max_in_flight[link], self.in_flight[link])
            self.waits.append((tier, time.monotonic() - t0))
            self.waits_total += 1
            return grant

    def waits_since(self, cursor: int) -> tuple[int, list[tuple[Tier, float]]]:
        """The new cursor and the waits recorded after ``cursor`` that are still kept (a
        reader more than ``WAITS_KEPT`` behind misses the oldest); a cursor past the total
        (fresh credits, ``Executor.set_credits``) starts again from 0."""
        with self._cv:
            end = self.waits_total
            new = min(end - (cursor if cursor <= end else 0), len(self.waits))
            return end, list(self.waits)[len(self.waits) - new:]

    def _let_go(self, link: Link, session: SessionKey | None) -> None:
        """One request or grant of ``session`` on ``link`` ended; at the last, its bucket
        there goes (``CreditManager.forget_session``)."""
        self._users[(link, session)] -= 1
        if self._users[(link, session)] <= 0:
            del self._users[(link, session)]
            mgr = self._managers.get(link)  # none yet if it gave way before it queued
            if mgr is not None:
                mgr.forget_session(session)

    def session_buckets(self) -> int:
        """Session buckets held over every link and class (sessions with a transfer on it)."""
        with self._cv:
            return sum(m.session_buckets() for m in self._managers.values())

    def _wait_grant(self, session: SessionKey | None, link: Link, t0: float, timeout_s: float,
                    give_up: Callable[[], bool] | None) -> CreditGrant:
        background, fg = link.background, link.foreground
        if background and give_up is not None and give_up():
            raise Abandoned(f"{link}: gave way before it queued")
        if not background:
            self.waiting[fg] += 1
        try:
            # Foreground first: background is not even queued while an engine's restore
            # waits for this link or the link is full of foreground transfers.
            while background and (self.waiting[fg] or self.in_flight[fg] >= self.per_link):
                self._tick(link, t0, timeout_s, give_up)
            mgr = self._manager(link)
            grant = mgr.acquire(CreditRequest(session=session, resource=Resource.LINK,
                                              amount=1, link=str(link)), t0)
            while grant.outcome is CreditOutcome.DELAYED:
                got = self._granted.pop((link, grant.ticket), None)
                if got is not None:
                    return got
                try:
                    self._tick(link, t0, timeout_s, give_up)
                except (Abandoned, TimeoutError):
                    got = self._granted.pop((link, grant.ticket), None)
                    if got is None:
                        mgr.cancel(grant.ticket)
                    else:  # granted while we woke up: hand the credit straight back
                        mgr.release(got, time.monotonic())
                        self._poll(link, mgr)
                    raise
                self._poll(link, mgr)
            return grant
        finally:
            if not background:
                self.waiting[fg] -= 1
                self._cv.notify_all()

    def _tick(self, link: Link, t0: float, timeout_s: float,
              give_up: Callable[[], bool] | None) -> None:
        if give_up is not None and give_up():
            raise Abandoned(f"{link}: gave way while it waited")
        if not self._cv.wait(min(self.poll_s, timeout_s)) and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no credit on {link} after {timeout_s} s")

    def _poll(self, link: Link, mgr: CreditManager) -> None:
        for g in mgr.poll(time.monotonic()):
            self._granted[(link, g.ticket)] = g

    def wake(self) -> None:
        """Every waiting request looks again now whether it should give way."""
        with self._cv:
            self._cv.notify_all()

    def release(self, link: Link, grant: CreditGrant | None) -> None:
        with self._cv:
            self.in_flight[link] -= 1
            if grant is not None:
                mgr = self._managers[link]
                mgr.release(grant, time.monotonic())
                self._poll(link, mgr)
                self._let_go(link, grant.request.session)  # type: ignore[arg-type]
            self._cv.notify_all()
