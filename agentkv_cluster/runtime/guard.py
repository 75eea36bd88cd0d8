"""The page manager behind one lock, and every wait on it.

The controller actor is threaded (engine calls, the reconcile loop, up to 32 executor
threads), while ``Controller`` is plain single-threaded bookkeeping. ``Guarded`` runs
each call of the manager under one lock and wakes waiters whenever a call changed the
page table's ``changes`` counter (a pin dropped, a move ended, a tenant erased). The waits
the service needs live here, never in the manager: an engine load waiting for its pages
to stop moving, a blocked load waiting for any change, an erasure waiting for the
tenant's transfers in flight. Once the service stops (``stop``), every wait ends at once
with ``ServiceStopping``: a load blocked for room would otherwise hold its server thread,
and the service's stop, until its deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.erasure_receipts import TenantForgotten
from agentkv_cluster.runtime.records import Action, RequestRefused, RuntimeError_

LOAD_WAIT_S = 60.0  # an engine load waits at most this long for its pages to stop moving


class ServiceStopping(RuntimeError_):
    """The service is stopping: a call that would wait (for room, for pages to move) is
    refused instead; what it had started was undone."""


class StillMoving(RequestRefused):
    """A load's wait for its pages ran out (``LOAD_WAIT_S``) while a move of one still
    ran: its HBM copy being dropped, or its bytes on their way in. The page is slow, not
    lost, so the load is refused as busy (retry), never as ``page_lost``, and never
    served before its bytes are in HBM."""


class Guarded:
    """``Controller`` with every call under one lock, its page table's, event planner's,
    schedule's and demand hints' calls too (attribute reads are not locked)."""

    def __init__(self, manager: Controller) -> None:
        self.manager = manager
        self.cv = threading.Condition(threading.RLock())
        self.stopping = False  # ``stop`` ran: every wait ends with ``ServiceStopping``
        self.table = _Locked(manager.table, self)
        self.events = _Locked(manager.events, self)
        self.schedule = _Locked(manager.schedule, self)
        self.demand = _Locked(manager.table.demand, self)

    def __getattr__(self, name: str) -> Any:
        return _locked(getattr(self.manager, name), self)

    def stop(self) -> None:
        """End every wait now, and refuse later ones (``ServiceStopping``)."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()

    def _stopped(self) -> None:
        if self.stopping:
            raise ServiceStopping("the service is stopping; retry on another instance")

    def pause(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` (a retry's back-off), cut short by ``stop``."""
        with self.cv:
            self.cv.wait_for(lambda: self.stopping, timeout_s)
            self._stopped()

    def wait_idle(self, gids: list[int], timeout_s: float) -> bool:
        """Block until no page of ``gids`` is being moved out of HBM (``PageTable.settled``).
        While it waits the pages are wanted: background moves of them give way (see
        executor)."""
        with self.cv:
            table = self.manager.table
            table.demand.want(gids, 1)
            try:
                done = self.cv.wait_for(lambda: self.stopping or table.settled(gids),
                                        timeout_s)
            finally:
                table.demand.want(gids, -1)
            self._stopped()
            table.check_alive(gids)
            return done

    def wait_arrived(self, gids: list[int], timeout_s: float) -> None:
        """Block until no page of ``gids`` is on its way into HBM (``PageRecord.arriving``:
        a load pins such a page as it is and runs its own restores alongside); past
        ``timeout_s``, ``StillMoving``."""
        with self.cv:
            table = self.manager.table
            done = self.cv.wait_for(lambda: self.stopping or table.arrived(gids), timeout_s)
            self._stopped()
            table.check_alive(gids)
            if not done:
                raise StillMoving(f"a page of this load was still on its way into HBM "
                                  f"after {timeout_s:.0f} s; retry")

    def access_settled(self, gids: list[int], clock: Callable[[], float]
                       ) -> tuple[list[Action], list[Action], list[int], list[int]]:
        """``Controller.access`` once no page of ``gids`` moves (see ``wait_idle``), with
        no other call in between; ``StillMoving`` if one still does after ``LOAD_WAIT_S``."""
        with self.cv:
            if not self.wait_idle(gids, LOAD_WAIT_S):  # nothing is pinned yet
                raise StillMoving(f"a page of this load was still being moved out of HBM "
                                  f"after {LOAD_WAIT_S:.0f} s; retry")
            return self.access(gids, clock())

    def erased_since(self, tenant: str, epoch: int) -> bool:
        """``tenant`` was erased, or is being erased, since its erasure count was ``epoch``
        (``PageTable.erasures``, read as a call began): what the call did is void."""
        table = self.manager.table
        return table.erasures[tenant] != epoch or tenant in table.erasing

    def wait_changed(self, seen: int, timeout_s: float) -> int:
        """Block until the manager changed after change ``seen`` (or the timeout); returns
        the change count."""
        with self.cv:
            table = self.manager.table
            self.cv.wait_for(lambda: self.stopping or table.changes != seen, timeout_s)
            self._stopped()
            return table.changes

    def forget_tenant(self, tenant: str, wait_s: float = 30.0,
                      wake: Callable[[], None] = lambda: None) -> TenantForgotten:
        """Erase ``tenant`` from the manager: refuse its calls and cancel its moves, wait
        (at most ``wait_s``) for its transfers in flight, then drop everything of it.
        ``wake`` runs once the moves are cancelled: the transfer worker's moves waiting for
        a link credit look now and give up (``LinkCredits.wake``). It runs outside the
        lock, since a credit waiter reads the page table under it while holding the
        credits' own lock."""
        m = self.manager
        with self.cv:
            cancelled = m.begin_forget(tenant)
            self.cv.notify_all()  # loads waiting for its pages fail now
        wake()
        with self.cv:  # its calls are refused from here on: nothing of it starts meanwhile
            self.cv.wait_for(lambda: not m.table.tenant_moving(tenant), wait_s)
            gone = m.forget_tenant(tenant, cancelled)
            self.cv.notify_all()
            return gone


class _Locked:
    """A component of the manager (its page table, its event planner), locked like it."""

    def __init__(self, part: object, guard: Guarded) -> None:
        self._part = part
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        return _locked(getattr(self._part, name), self._guard)


def _locked(attr: Any, guard: Guarded) -> Any:
    """``attr`` itself if it is data, else a call of it under ``guard``'s lock that wakes
    the waiters when it changed the page table."""
    if not callable(attr):
        return attr
    table = guard.manager.table

    def call(*args: Any, **kwargs: Any) -> Any:
        with guard.cv:
            before = table.changes
            try:
                return attr(*args, **kwargs)
            finally:
                if table.changes != before:
                    guard.cv.notify_all()

    return call
