"""The service backend: block pages in the AgentKV service, through its wire client.

The service verifies each request's token (the tenant is the token's), blinds page keys
per namespace, keeps tenants apart and runs the lifecycle policy on the events. One
client connection per token, for the sessions cached (``sessions.py``: at most
``max_sessions``, least recently used first). Any transport failure marks the service
down for ``retry_after_s``: during that time every call fails fast
(``BackendUnavailable``) and vLLM recomputes, so a dead service costs prefill time, never a stuck request.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from agentkv_cluster.api.client import AgentKvClient, SessionClient
from agentkv_cluster.api.protocol import PageLostError, ProtocolError, RemoteError
from agentkv_cluster.engines.vllm.backend import BackendUnavailable, Caller, CallerRefused
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.sessions import DEFAULT_MAX_SESSIONS, SessionCache, SessionEntry
from agentkv_cluster.lifecycle.identity import PageIdentity

log = logging.getLogger(__name__)
# Service keys remembered per (token, block), about 300 B each: 128 Ki blocks is ~37 MiB.
MAX_CACHED_KEYS = 1 << 17
_REFUSED = {"unauthenticated", "access_denied", "forbidden"}


def _claims(token: str) -> dict[str, Any]:
    """The token's claims, unverified (the service verifies; this only reads hints)."""
    try:
        body = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (IndexError, ValueError):
        return {}


class ServiceBackend:
    name = "service"

    def __init__(self, address: tuple[str, int] | str, *, default_token: str | None = None,
                 timeout_s: float = 5.0, retry_after_s: float = 5.0,
                 max_cached_keys: int = MAX_CACHED_KEYS,
                 max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.address = address
        self.default_token = default_token
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        # (token, session) -> its client and whether its task was started, least recently
        # used first: forgotten on every outage (the service may come back empty), and a
        # new token (a tenant made anew after an erasure) starts its task again
        self.sessions = SessionCache(max_sessions)
        # (token, identity digest) -> service key: keys are blinded per tenant, and a token
        # issued after an erasure starts the tenant anew; forgotten on every outage (the
        # service may come back empty), so saves are never skipped for pages it lost; the
        # oldest go past max_cached_keys (one forgotten costs a lookup or a repeated save)
        self._keys: OrderedDict[tuple[str | None, bytes], bytes] = OrderedDict()
        self.max_cached_keys = max_cached_keys
        self._version = 0  # the last event version sent (``_next_version_locked``)
        self._down_until = 0.0
        self.outages = 0  # failures this process saw (the scheduler's go to the worker)
        self._peer_outages = 0

    # -- transport ------------------------------------------------------------------
    def _entry_locked(self, caller: Caller) -> SessionEntry:
        """The caller's session, opened (and cached) if it is not cached."""
        assert caller.token is not None
        entry = self.sessions.get(caller.token, caller.session)
        if entry is not None:
            return entry
        if time.monotonic() < self._down_until:
            raise BackendUnavailable("AgentKV service marked down; retrying later")
        client = self.sessions.connection(caller.token)
        fresh = None  # a connection made here: closed again if the session does not open
        try:
            if client is None:
                client = fresh = AgentKvClient.connect(self.address, caller.token,
                                                       self.timeout_s)
            sc = client.open_session(caller.session)
        except BaseException as exc:
            _close([fresh] if fresh is not None else [])
            if not isinstance(exc, (OSError, ConnectionError)):
                raise
            self._mark_down_locked(exc)
            raise BackendUnavailable(f"AgentKV service unreachable: {exc}") from exc
        entry, unused = self.sessions.add(caller.token, sc)
        _close(unused)
        return entry

    def _mark_down_locked(self, exc: BaseException) -> None:
        if time.monotonic() >= self._down_until:
            log.warning("AgentKV service %s failed (%s); recomputing for %.0f s",
                        self.address, exc, self.retry_after_s)
        self._down_until = time.monotonic() + self.retry_after_s
        self.outages += 1
        _close(self.sessions.clear())
        self._keys.clear()

    def _with_session(self, caller: Caller, fn: Any) -> Any:
        """``fn(session_client)``, its connection kept open until it returns."""
        with self._lock:
            sc = self._entry_locked(caller).client
            conn = self.sessions.lease(caller.token or "")
        try:
            return fn(sc)
        finally:
            with self._lock:
                _close(self.sessions.release(conn))

    def _call(self, caller: Caller, fn: Any, *args: Any) -> Any:
        if time.monotonic() < self._down_until:
            raise BackendUnavailable("AgentKV service marked down; retrying later")
        try:
            return self._with_session(caller, lambda sc: fn(sc, *args))
        except RemoteError as exc:
            if exc.code in _REFUSED:
                raise CallerRefused(f"AgentKV service refused: {exc}") from None
            raise
        except (OSError, ConnectionError, ProtocolError) as exc:
            with self._lock:
                self._mark_down_locked(exc)
            raise BackendUnavailable(f"AgentKV service failed: {exc}") from exc

    # -- BlockBackend -----------------------------------------------------------------
    def resolve(self, token: str | None, session: str | None) -> Caller:
        token = token or self.default_token
        if token is None:
            raise CallerRefused("this engine needs an AgentKV token in the hints")
        claims = _claims(token)
        probe = Caller(tenant=str(claims.get("ten", "?")), session=session or "vllm",
                       token=token)
        try:
            opened = self._with_session(probe, lambda sc: sc.client.call(
                "open_session", {"session": probe.session}))
        except RemoteError as exc:
            raise CallerRefused(f"AgentKV service refused the token: {exc}") from None
        except (OSError, ConnectionError, ProtocolError) as exc:
            with self._lock:
                self._mark_down_locked(exc)
            raise BackendUnavailable(f"AgentKV service failed: {exc}") from exc
        return Caller(tenant=opened["tenant"], session=probe.session, token=token,
                      public_read=claims.get("pub") is True,
                      is_admin="admin" in (claims.get("roles") or ()),
                      can_publish="publish" in (claims.get("roles") or ()))

    def lookup(self, caller: Caller, identities: Sequence[PageIdentity]) -> int:
        if not identities:
            return 0
        try:
            got = self._call(caller, SessionClient.lookup_prefix, [i.pack() for i in identities])
        except RemoteError as exc:
            raise BackendUnavailable(f"lookup failed: {exc}") from None
        if got.get("refused"):
            raise CallerRefused(f"AgentKV service refused the lookup: {got['refused']}")
        n = int(got["length"])
        with self._lock:
            for ident, key in zip(identities[:n], got["keys"]):
                self._remember_locked((caller.token, ident.digest()), key)
            for ident in identities[n:]:  # not held (any more): the next save stores it
                self._keys.pop((caller.token, ident.digest()), None)
        return n

    def contains(self, caller: Caller, identity: PageIdentity) -> bool:
        return (caller.token, identity.digest()) in self._keys

    def get(self, caller: Caller, identity: PageIdentity) -> bytes | None:
        key = self._keys.get((caller.token, identity.digest()))
        if key is None:
            if not self.lookup(caller, [identity]):
                return None
            key = self._keys.get((caller.token, identity.digest()))
            if key is None:
                return None
        try:
            return self._call(caller, SessionClient.load, [key])[0]
        except RemoteError as exc:
            # not held any more, or lost by the service (its only copy died): a miss that
            # vLLM recomputes; the key is forgotten, so a later save stores it again
            if isinstance(exc, PageLostError) or exc.code == "not_found":
                self._keys.pop((caller.token, identity.digest()), None)
                return None
            raise BackendUnavailable(f"load failed: {exc}") from None

    def put(self, caller: Caller, identity: PageIdentity, data: bytes) -> None:
        page = {"identity": identity.pack(), "data": data, "state_type": "temp_reasoning",
                "page_id": identity.start}
        try:
            key = self._call(caller, SessionClient.store_pages, [page])[0]
        except RemoteError as exc:
            raise BackendUnavailable(f"store failed: {exc}") from None
        with self._lock:
            self._remember_locked((caller.token, identity.digest()), key)

    def _remember_locked(self, ident: tuple[str | None, bytes], key: bytes) -> None:
        keys = self._keys
        keys[ident] = key
        keys.move_to_end(ident)
        while len(keys) > self.max_cached_keys:
            keys.popitem(last=False)

    def event(self, caller: Caller, event: HintEvent) -> None:
        with self._lock:
            entry = self._entry_locked(caller)
            if event.kind is HintKind.OBSERVATION_RETURN and not (event.call_id
                                                                   or entry.tool_call):
                raise ValueError("observation_return without call_id, and no tool_start "
                                 "of this session is known to this engine")
            implicit = not entry.started and event.kind is not HintKind.TASK_START
            entry.started = True
            start = self._next_version_locked()
            version = self._next_version_locked() if implicit else start
            fields: dict[str, Any] = {"kind": event.kind.value, **_common(version)}
            if event.kind is HintKind.TOOL_START:
                entry.tool_call = event.call_id or f"t{version}"
                fields.update(call_id=entry.tool_call, tool=event.tool)
            elif event.kind is HintKind.OBSERVATION_RETURN:
                fields["call_id"] = event.call_id or entry.tool_call
        if implicit:  # the service may have a task already (another token of the tenant)
            with contextlib.suppress(ValueError):
                self._send(caller, {"kind": "task_start", "prefix_generation": 1,
                                    **_common(start)})
        if event.kind is HintKind.TASK_START:
            fields["prefix_generation"] = 1
        elif event.kind is HintKind.MODEL_CALL:
            fields["call_id"] = event.call_id or f"m{version}"
        elif event.kind is HintKind.BRANCH_ABANDONED:
            fields.update(kind="rollback", branch=event.branch or "main")
        self._send(caller, fields)
        if event.kind is HintKind.TASK_END:  # a next task of the session starts anew
            with self._lock:
                entry.started = False

    def end_session(self, caller: Caller) -> bool:
        """The agent session is over (the request that carried its ``task_end`` finished):
        close it on the service (``close_session``: the pages only it holds retire, as
        the embedded store retires them at ``task_end``; the service forgets it) and here.
        False when the service could not be told (it keeps the session)."""
        try:
            self._call(caller, SessionClient.close)
        except (BackendUnavailable, CallerRefused, RemoteError) as exc:
            log.warning("AgentKV: session %s not closed: %s", caller.session, exc)
            return False
        finally:
            with self._lock:
                _close(self.sessions.discard(caller.token or "", caller.session))
        return True

    def _next_version_locked(self) -> int:
        """An event version above every one this backend sent, and above what an earlier
        engine process sent (wall-clock microseconds, unless this one sends faster). The
        service wants each session's versions strictly increasing; one counter for all
        sessions keeps them so with no record per session, also for a session evicted from
        the cache and opened again, or one an earlier engine served."""
        self._version = max(self._version + 1, time.time_ns() // 1000)
        return self._version

    def _send(self, caller: Caller, fields: dict[str, Any]) -> None:
        kind = fields.pop("kind")
        try:
            self._call(caller, lambda sc: sc.event(kind, **fields))
        except RemoteError as exc:
            raise ValueError(f"the service rejected {kind}: {exc}") from None

    def peer_outages(self, count: int) -> None:
        """The other process (vLLM's scheduler) saw the service fail ``count`` times: it
        may have come back empty, so what this one remembers (keys of blocks it stored,
        tasks it started, connections) is forgotten; without a failure of its own, the
        worker would otherwise skip saving every block it had stored before."""
        with self._lock:
            if count > self._peer_outages:
                self._peer_outages = count
                _close(self.sessions.clear())
                self._keys.clear()

    def close(self) -> None:
        with self._lock:
            _close(self.sessions.clear())


def _close(clients: list[AgentKvClient]) -> None:
    for client in clients:
        with contextlib.suppress(OSError):
            client.close()


def _common(version: int) -> dict[str, Any]:
    return {"event_id": version, "task_id": "task", "version": version, "ts": time.time()}
