"""The page manager behind one lock, and every wait on it.

The controller actor is threaded (engine calls, the reconcile loop, up to 32 executor
threads), while ``Controller`` is plain single-threaded bookkeeping. ``Guarded`` runs
each call of the manager under one lock and wakes waiters whenever a call changed the
manager's ``changes`` counter (a pin dropped, a move ended, a tenant erased). The waits
the service needs live here, never in the manager: an engine load waiting for its pages
to stop moving, a blocked load waiting for any change, an erasure waiting for the
tenant's transfers in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import Action, TenantForgotten

LOAD_WAIT_S = 60.0  # an engine load waits at most this long for its pages to stop moving


class Guarded:
    """``Controller`` with every call under one lock (attribute reads are not locked)."""

    def __init__(self, manager: Controller) -> None:
        self.manager = manager
        self.cv = threading.Condition(threading.RLock())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.manager, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.cv:
                before = self.manager.changes
                try:
                    return attr(*args, **kwargs)
                finally:
                    if self.manager.changes != before:
                        self.cv.notify_all()

        return call

    def wait_idle(self, gids: list[int], timeout_s: float) -> bool:
        """Block until no page of ``gids`` has a demote or restore in flight. While it
        waits the pages are wanted: background moves of them give way (see executor)."""
        with self.cv:
            m = self.manager
            m.want(gids, 1)
            try:
                done = self.cv.wait_for(lambda: m.settled(gids), timeout_s)
            finally:
                m.want(gids, -1)
            m.check_alive(gids)
            return done

    def access_settled(self, gids: list[int], clock: Callable[[], float]
                       ) -> tuple[list[Action], list[Action], list[int], list[int]]:
        """``Controller.access`` once no page of ``gids`` moves (see ``wait_idle``), with
        no other call in between."""
        with self.cv:
            self.wait_idle(gids, LOAD_WAIT_S)
            return self.access(gids, clock())

    def wait_changed(self, seen: int, timeout_s: float) -> int:
        """Block until the manager changed after change ``seen`` (or the timeout); returns
        the change count."""
        with self.cv:
            self.cv.wait_for(lambda: self.manager.changes != seen, timeout_s)
            return self.manager.changes

    def forget_tenant(self, tenant: str, wait_s: float = 30.0) -> TenantForgotten:
        """Erase ``tenant`` from the manager: refuse its calls and cancel its moves, wait
        (at most ``wait_s``) for its transfers in flight, then drop everything of it."""
        with self.cv:
            m = self.manager
            cancelled = m.begin_forget(tenant)
            self.cv.notify_all()  # loads waiting for its pages fail now
            self.cv.wait_for(lambda: not m.tenant_moving(tenant), wait_s)
            gone = m.forget_tenant(tenant, cancelled)
            self.cv.notify_all()
            return gone
