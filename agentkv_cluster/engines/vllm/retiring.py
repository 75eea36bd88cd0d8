"""When a session's retiring hints take effect, so that nothing in flight loses its blocks.

Embedded store (``hold_retiring``): the worker applies a step's events before the step's
loads, so a session's retiring event (``task_end``, ``branch_abandoned``) while it loads
in this step, and its later events, wait for the next step (applied first, a ``task_end``
retired the blocks its own request was restoring, which were then recomputed).

Service (``SessionCloses``, pure, and ``CloseSender``, its shell): ``task_end`` ends a
session's episode, and the service is then told to close the session (``close_session``:
the blocks only it holds retire). Requests of the session may still
be in flight then: running, waiting in vLLM's queue, or finished with saves the worker
has not written yet. A close sent at once made their saves and loads fail. So, like
vLLM's own connectors with delayed block freeing:

1. every request of a session counts as in flight from its arrival (vLLM's
   ``on_new_request``) to its ``request_finished``;
2. a session whose task ended is closed only once none of its requests is in flight; the
   last one to finish *carries* the close: ``request_finished`` keeps its blocks (returns
   True) and the worker reports it finished (``get_finished``) only after every save it
   queued before has been written;
3. then the close is due (``released``) and the scheduler sends it, after any lookup
   already queued for the session.

A request of the session carrying ``task_start`` that arrives before the close is sent
begins a new episode under that name: the close is dropped (the old episode's blocks are
left to the service's eviction, as for a session that never sent ``task_end``). Any
other request that arrives meanwhile is in flight like the rest: the close waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Protocol

from agentkv_cluster.engines.vllm.backend import Caller
from agentkv_cluster.engines.vllm.hints import AgentHints, HintEvent, HintKind
from agentkv_cluster.engines.vllm.meta import RequestOps

log = logging.getLogger(__name__)
_RETIRING = (HintKind.TASK_END, HintKind.BRANCH_ABANDONED)
Events = list[tuple[Caller, HintEvent]]

SessionKey = tuple[str, str]  # (the hints' token, or "" for the engine's default; session)


def hold_retiring(loading: set[tuple[str, str]], held: Events, events: Events
                  ) -> tuple[Events, Events]:
    """(the step's events for the worker, the events held for the next step): ``held``
    first, then ``events`` except a retiring one of a session in ``loading`` (its
    (tenant, session) loads in this step) and every later one of that session."""
    out, later, waiting = list(held), [], set()
    for caller, event in events:
        sess = (caller.tenant, caller.session)
        if sess in waiting or (sess in loading and event.kind in _RETIRING):
            waiting.add(sess)
            later.append((caller, event))
        else:
            out.append((caller, event))
    return out, later


def session_key(hints: AgentHints) -> SessionKey | None:
    """The session a request belongs to, or None (no session named)."""
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

    def released(self, req_ids: Iterable[str]) -> list[Admitted]:
        """The worker released these requests (every save queued before them is written):
        the sessions now to close. One whose request arrived meanwhile waits for it."""
        due: list[Admitted] = []
        for req_id in req_ids:
            key = self._carriers.pop(req_id, None)
            if key is None or self.in_flight(key):
                continue
            request = self._ending.pop(key, None)
            if request is not None:
                due.append(request)
        return due

    def drain(self) -> list[Admitted]:
        """Every close not sent yet (the engine shuts down: no request will finish)."""
        due = [r for r in self._ending.values() if r is not None]
        self._ending.clear()
        self._carriers.clear()
        return due


class CloseSender:
    """The shell around ``SessionCloses``: sends each close it makes due on the scheduler's
    lookup thread (after any lookup queued before it: a next request's admission, queued
    after, opens the session again), and at shutdown every close not sent yet."""

    def __init__(self, pool: ThreadPoolExecutor, end: Callable[[Caller], bool]) -> None:
        self.ledger = SessionCloses()
        self._pool = pool
        self._end = end  # ``ServiceBackend.end_session``
        self._sent: list[Future] = []

    @classmethod
    def of(cls, backend: object, pool: ThreadPoolExecutor | None) -> CloseSender | None:
        """The sender for a remote backend that closes sessions (``end_session``)."""
        end = getattr(backend, "end_session", None)
        return cls(pool, end) if pool is not None and end is not None else None

    def arrived(self, hints: AgentHints) -> None:
        key = session_key(hints)
        if key is not None:
            self.ledger.arrived(key, hints)

    def finished(self, req_id: str, st: Any) -> bool:
        """``SessionCloses.finished`` for the scheduler's request ``st`` (its ``hints``)."""
        key = session_key(st.hints)
        return key is not None and self.ledger.finished(req_id, key, st)

    def finish(self, req_id: str, st: Any, ops: list[RequestOps], delay: bool) -> bool:
        """The scheduler's request ``st`` (its ``hints`` and ``caller``) finished; ``delay``:
        vLLM keeps its blocks for its tail save. When it carries its session's close, vLLM
        keeps them (True) until the worker wrote every save queued before it: a
        ``barrier`` release in the next step's ``ops`` (on its tail save's, if any)."""
        if not self.finished(req_id, st):
            return delay
        if delay:
            ops[-1] = replace(ops[-1], barrier=True)
        else:  # a release only: no save or load reads its caller
            key = session_key(st.hints)
            caller = st.caller or Caller(tenant="", session=key[1] if key else "")
            ops.append(RequestOps(req_id, caller, release=True, barrier=True))
        return True

    def released(self, req_ids: Iterable[str]) -> None:
        """vLLM freed these requests' blocks: send the closes now due (never raises)."""
        try:
            for request in self.ledger.released(tuple(req_ids)):
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
