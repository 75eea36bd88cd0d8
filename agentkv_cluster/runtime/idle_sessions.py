"""Sessions nobody uses any more: when each open session was last used, and which have
been idle for longer than the service keeps an abandoned session.

An agent that crashes, or a platform that forgets ``close_session``, leaves its session
open: its page records, event graph and predictor state would stay for the life of the
service. The controller actor touches a session on every call that succeeds for it and,
once a second, closes those idle for ``controller.idle_session_s`` (0: never) as the
client's own ``close_session`` would. Pure bookkeeping: the caller passes ``now``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from agentkv_cluster.runtime.records import TenantErased

log = logging.getLogger(__name__)

SessionId = tuple[str, str]  # (tenant, session)


class IdleSessions:
    def __init__(self, idle_s: float) -> None:
        if idle_s < 0:
            raise ValueError(f"idle_s must be >= 0 (0: never), got {idle_s!r}")
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._used: OrderedDict[SessionId, float] = OrderedDict()  # oldest use first
        self.expired = 0  # sessions closed for being idle

    def touch(self, tenant: str, session: str, now: float) -> None:
        """A call of the session succeeded at ``now``."""
        with self._lock:
            self._used[(tenant, session)] = now
            self._used.move_to_end((tenant, session))

    def forget(self, tenant: str, session: str) -> None:
        """The session was closed."""
        with self._lock:
            self._used.pop((tenant, session), None)

    def forget_tenant(self, tenant: str) -> None:
        """The tenant was erased: so were its sessions."""
        with self._lock:
            for key in [k for k in self._used if k[0] == tenant]:
                del self._used[key]

    def due(self, now: float) -> list[SessionId]:
        """Sessions unused for ``idle_s`` or longer at ``now``, oldest first; each is
        forgotten here (the caller closes it). Never any when ``idle_s`` is 0."""
        out: list[SessionId] = []
        if not self.idle_s:
            return out
        with self._lock:
            while self._used:
                key, used = next(iter(self._used.items()))
                if now - used < self.idle_s:
                    break
                del self._used[key]
                out.append(key)
        return out

    def sweep(self, now: float, close: Callable[[str, str], bool]) -> int:
        """Close (``close(tenant, session)``: whether it was open) every session ``due``
        at ``now``; returns how many were closed. One being erased is skipped: its
        sessions go with the erasure."""
        n = 0
        for tenant, session in self.due(now):
            try:
                closed = close(tenant, session)
            except TenantErased:
                continue
            if closed:
                n += 1
                log.info("closed session %r of tenant %r: unused for %.0f s or more",
                         session, tenant, self.idle_s)
        self.expired += n
        return n

    def __len__(self) -> int:
        with self._lock:
            return len(self._used)
