"""When a session's retiring hints take effect, so that nothing in flight loses its blocks.

``task_end`` ends a session's episode and ``branch_abandoned`` one branch of it: the
blocks only they hold retire (embedded store), or the service is told to close the
session (``close_session``). Requests of the session may still be in flight then:
running, waiting in vLLM's queue, or finished with saves the worker has not written yet.
Taking effect at once made their planned loads fail (recomputed) and let their saves land
after the retire. So, like vLLM's own connectors with delayed block freeing, both
backends use one ledger (``SessionCloses``, pure):

1. every request of a session counts as in flight from its arrival (vLLM's
   ``on_new_request``) to its ``request_finished``;
2. a session with a retiring hint waiting takes it only once none of its requests is in
   flight; the last one to finish *carries* it: ``request_finished`` keeps its blocks
   (returns True) and the worker reports it finished (``get_finished``) only after every
   save it queued before has been written. One aborted while its asynchronous load runs
   is held by vLLM itself until the load is reported, and freed then: reporting it
   finished as well would free it twice (vLLM asserts). Its barrier, with no release,
   is reported in the worker's metadata instead (``passed``);
3. then the hint is due (``released``) and takes effect:

   - service (``CloseSender``): ``task_end``'s close goes out on the scheduler's lookup
     thread, after any lookup already queued for the session. Its session is the hints'
     (token, session): the service keeps sessions per token;
   - embedded (``RetireHold``): the held ``task_end`` / ``branch_abandoned`` events go to
     the worker with the next step's metadata (a request of the session that arrived
     meanwhile holds them again). Its session is the verified caller's (tenant, session),
     as the store keeps it; a hint sent on its own (the hint socket) waits the same way.

A request of the session carrying ``task_start`` that arrives before the hint takes
effect begins a new episode under that name: the waiting hint is dropped (the old
episode's blocks are left to the eviction policy, as for a session that never sent
``task_end``). Any other request that arrives meanwhile is in flight like the rest: the
hint waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Protocol

from agentkv_cluster.engines.vllm.backend import Caller, CallerRefused
from agentkv_cluster.engines.vllm.hints import AgentHints, HintEvent, HintKind
from agentkv_cluster.engines.vllm.meta import RequestOps

log = logging.getLogger(__name__)
_RETIRING = (HintKind.TASK_END, HintKind.BRANCH_ABANDONED)
Events = list[tuple[Caller, HintEvent]]

# (the hints' token or "", session) for the service; (tenant, session) for the embedded store
SessionKey = tuple[str, str]


def session_key(hints: AgentHints) -> SessionKey | None:
    """The service session a request belongs to, or None (no session named)."""
    return None if hints.session is None else (hints.token or "", hints.session)


class Admitted(Protocol):
    """A request as the scheduler keeps it: its caller, set once admitted (on the lookup
    thread, so possibly after it finished: read when the close is sent, behind it)."""

    caller: Caller | None


class SessionCloses:
    """In-flight requests per session and the closes they hold back (no I/O, no clock)."""

    def __init__(self) -> None:
        self._live: dict[SessionKey, int] = {}
        # task ended: to close once none of its requests is in flight, as the caller of
        # one of them that finished (None while none has)
        self._ending: dict[SessionKey, Admitted | None] = {}
        self._carriers: dict[str, SessionKey] = {}  # req id -> the close its release frees

    def in_flight(self, key: SessionKey) -> int:
        return self._live.get(key, 0)

    @property
    def waiting(self) -> int:
        """Sessions whose task ended and which are not closed yet."""
        return len(self._ending)

    def arrived(self, key: SessionKey, hints: AgentHints) -> None:
        """A request of ``key`` arrived; its events, in order, end or begin an episode."""
        self._live[key] = self._live.get(key, 0) + 1
        for event in hints.events:
            if event.kind is HintKind.TASK_START:
                self._ending.pop(key, None)
            elif event.kind is HintKind.TASK_END:
                self._ending.setdefault(key, None)

    def finished(self, req_id: str, key: SessionKey, request: Admitted) -> bool:
        """A request of ``key`` finished. True when it carries its session's close: its
        release must wait for its saves (``released``)."""
        left = self._live.get(key, 0) - 1
        if left > 0:
            self._live[key] = left
        else:
            self._live.pop(key, None)
        if key not in self._ending:
            return False
        known = self._ending[key]
        if known is None or known.caller is None or request.caller is not None:
            self._ending[key] = request  # the latest, unless only an earlier one is admitted
        if left > 0:
            return False
        self._carriers[req_id] = key
        return True

    def hold(self, key: SessionKey) -> None:
        """A retiring hint of ``key`` waits for its requests in flight (embedded store)."""
        self._ending.setdefault(key, None)

    def released(self, req_ids: Iterable[str]) -> dict[SessionKey, Admitted | None]:
        """The worker released these requests (every save queued before them is written):
        the sessions whose hint is now due, with the request that carried it. One whose
        request arrived meanwhile waits for it."""
        due: dict[SessionKey, Admitted | None] = {}
        for req_id in req_ids:
            key = self._carriers.pop(req_id, None)
            if key is None or self.in_flight(key) or key not in self._ending:
                continue
            due[key] = self._ending.pop(key)
        return due

    def drain(self) -> list[Admitted]:
        """Every close not sent yet (the engine shuts down: no request will finish)."""
        due = [r for r in self._ending.values() if r is not None]
        self._ending.clear()
        self._carriers.clear()
        return due


class _InFlight:
    """What both shells share: the ledger, each request's session taken on its arrival,
    and the release that makes the request carrying its session's hint wait for its
    saves. A shell says only how a request's hints name its session (``key``)."""

    def __init__(self) -> None:
        self.ledger = SessionCloses()
        self._keys: dict[str, SessionKey] = {}  # req id -> its session, from its arrival
        self.barriers: set[str] = set()  # carriers vLLM holds itself: their barrier's report

    def key(self, hints: AgentHints) -> SessionKey | None:
        raise NotImplementedError

    def arrived(self, req_id: str, hints: AgentHints) -> SessionKey | None:
        key = self.key(hints)
        if key is not None:
            self._keys[req_id] = key
            self.ledger.arrived(key, hints)
        return key

    def finished(self, req_id: str, st: Any) -> bool:
        """``SessionCloses.finished`` for the scheduler's request ``st``."""
        key = self._keys.pop(req_id, None)
        return key is not None and self.ledger.finished(req_id, key, st)

    def finish(self, req_id: str, st: Any, ops: list[RequestOps], delay: bool) -> bool:
        """The scheduler's request ``st`` (its ``caller``, ``loading``) finished; ``delay``:
        vLLM keeps its blocks for its tail save. When it carries its session's hint, vLLM
        keeps them (True) until the worker wrote every save queued before it: a ``barrier``
        release in the next step's ``ops`` (on its tail save's, if any). One still loading
        gets a barrier without a release: vLLM keeps and frees its blocks for the load."""
        key = self._keys.get(req_id)
        if not self.finished(req_id, st):
            return delay
        # a release or barrier only: no save or load reads its caller
        caller = st.caller or Caller(tenant="", session=key[1] if key else "")
        if st.loading:
            self.barriers.add(req_id)
            ops.append(RequestOps(req_id, caller, barrier=True))
            return False
        if delay:
            ops[-1] = replace(ops[-1], barrier=True)
        else:
            ops.append(RequestOps(req_id, caller, release=True, barrier=True))
        return True

    def _passed(self, req_ids: Iterable[str]) -> dict[SessionKey, Admitted | None]:
        """``SessionCloses.released``, for the released requests and passed barriers."""
        ids = tuple(req_ids)
        self.barriers.difference_update(ids)
        return self.ledger.released(ids)


def retiring_for(backend: Any, pool: ThreadPoolExecutor | None
                 ) -> CloseSender | RetireHold | None:
    """The shell for ``backend``: the embedded store's directory (``take_events``) holds
    retiring events, a remote backend that closes sessions (``end_session``) sends
    closes on the lookup thread ``pool``."""
    if getattr(backend, "take_events", None) is not None:
        return RetireHold(backend.resolve)
    end = getattr(backend, "end_session", None)
    return CloseSender(pool, end) if pool is not None and end is not None else None


class RetireHold(_InFlight):
    """Embedded store: the step's lifecycle events for the worker, each ``task_end`` and
    ``branch_abandoned`` held until no request of its session is in flight."""

    def __init__(self, resolve: Callable[[str | None, str | None], Caller]) -> None:
        super().__init__()
        self._resolve = resolve  # the directory's: tokens verified on arrival
        self._held: dict[SessionKey, Events] = {}
        self._due: list[SessionKey] = []

    def key(self, hints: AgentHints) -> SessionKey | None:
        """The store's session: (tenant, session) of the verified caller; None for a
        caller refused (it is not admitted either: no events, loads or saves)."""
        try:
            caller = self._resolve(hints.token, hints.session)
        except CallerRefused:
            return None
        return (caller.tenant, caller.session)

    def arrived(self, req_id: str, hints: AgentHints) -> SessionKey | None:
        key = super().arrived(req_id, hints)
        if key is not None and any(e.kind is HintKind.TASK_START for e in hints.events):
            self._held.pop(key, None)  # a new episode: the old one's hints are dropped
        return key

    @property
    def held(self) -> int:
        """Retiring events waiting."""
        return sum(len(events) for events in self._held.values())

    def released(self, req_ids: Iterable[str]) -> None:
        """vLLM freed these requests' blocks: their sessions' hints go out next step."""
        self._due.extend(self._passed(req_ids))

    def take(self, events: Events) -> Events:
        """The events for this step's metadata: those now due first, then ``events``
        (the directory's, in order) except the retiring ones of a session in flight or
        with one held already."""
        out: Events = []
        for key in self._due:
            if key not in self._held:  # dropped: a new episode began
                continue
            if self.ledger.in_flight(key):  # one arrived since: the last to finish carries
                self.ledger.hold(key)
            else:
                out.extend(self._held.pop(key, ()))
        self._due = []
        for caller, event in events:
            key = (caller.tenant, caller.session)
            if event.kind in _RETIRING and (key in self._held or self.ledger.in_flight(key)):
                self._held.setdefault(key, []).append((caller, event))
                self.ledger.hold(key)
            else:
                out.append((caller, event))
        return out


class CloseSender(_InFlight):
    """Service: sends each close the ledger makes due on the scheduler's lookup thread
    (after any lookup queued before it: a next request's admission, queued after, opens
    the session again), and at shutdown every close not sent yet."""

    def __init__(self, pool: ThreadPoolExecutor, end: Callable[[Caller], bool]) -> None:
        super().__init__()
        self._pool = pool
        self._end = end  # ``ServiceBackend.end_session``
        self._sent: list[Future] = []

    def key(self, hints: AgentHints) -> SessionKey | None:
        return session_key(hints)

    def released(self, req_ids: Iterable[str]) -> None:
        """vLLM freed these requests' blocks: send the closes now due (never raises)."""
        try:
            for request in self._passed(req_ids).values():
                if request is not None:
                    self._send(request)
        except Exception:  # never into vLLM's scheduler: that session stays open
            log.exception("AgentKV: sending a session close failed")

    def _send(self, request: Admitted) -> None:
        self._sent = [f for f in self._sent if not f.done()]
        try:
            self._sent.append(self._pool.submit(self._close, request))
        except RuntimeError:  # the lookup thread was stopped: the service keeps it
            log.warning("AgentKV: a session close not sent: the engine is stopping")

    def _close(self, request: Admitted) -> bool:
        """On the lookup thread, after the request's own admission (queued before)."""
        caller = request.caller
        if caller is None:  # never admitted (refused, service down): no task to close
            return False
        return self._end(caller)

    def flush(self, in_flight: Iterable[tuple[str, Any]], timeout_s: float) -> int:
        """The engine stops: the requests still ``in_flight`` will not finish, so every
        session whose task ended is closed now; waits at most ``timeout_s`` for the
        closes (queued behind any lookup still running) and returns how many were not
        sent (logged: the service keeps those sessions)."""
        for req_id, st in in_flight:
            self.finished(req_id, st)
        for request in self.ledger.drain():
            self._send(request)
        left = len(wait(self._sent, timeout_s).not_done)
        if left:
            log.warning("AgentKV: %d session closes not sent within %.1f s of shutdown; "
                        "the service keeps those sessions", left, timeout_s)
        return left
