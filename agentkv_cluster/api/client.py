"""Python client of the wire protocol (blocking; one request in flight per connection).

    client = AgentKvClient.connect(("127.0.0.1", 7420), token)
    with client.open_session("sess-1") as s:  # closed on exit (``SessionClient.close``)
        s.task_start(task="fix bug"); s.store_pages([...]); s.tool_start(call_id="c1", tool="grep")

Error replies raise ``protocol.RemoteError`` (its ``code`` is the reply's code); a code
with a class of its own raises that subclass: ``PageLostError`` for ``page_lost`` (the
service lost a page: recompute it).
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from typing import Any, Self

from agentkv_cluster.api import protocol as p

# A burst of new connections from one address can find the oldest unauthenticated ones
# closed (or refused busy) by the server's pre-auth limits: the hello that authenticates a
# connection has no effect, so it is tried again on a fresh connection, this many times.
HELLO_RETRIES = 6

# Under HBM pressure a prepared load's pins may be revoked for another tenant (or time
# out) before its ``complete_load``, which then answers ``not_found``: ``SessionClient.load``
# prepares it again, backing off, this many times in all.
LOAD_ATTEMPTS = 4

EVENT_KINDS = (  # agentkv_cluster.lifecycle.events.EventKind values
    "task_start", "model_call", "tool_start", "observation_return",
    "branch_create", "verification_pass", "rollback", "task_end",
)


def _back_off(first_s: float, attempt: int) -> None:
    """Sleep before retry ``attempt`` (0 first): ``first_s`` doubling, at most 1 s, with
    +-50 % jitter so that clients refused together do not retry together."""
    time.sleep(min(1.0, first_s * 2 ** attempt) * random.uniform(0.5, 1.5))


class _ClosedOnExit:
    """``with`` closes it (``close``); after the block's own exception, a close that fails
    too is not raised over it."""

    def close(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the block's own exception is the one to see, not a failed close after it
            self.close()
        except (OSError, p.RemoteError, p.ProtocolError):
            pass


class AgentKvClient(_ClosedOnExit):
    """A connection to one AgentKV server, authenticated by a bearer token."""

    def __init__(self, sock: socket.socket, token: str | None,
                 max_frame: int = p.DEFAULT_MAX_FRAME) -> None:
        self._sock = sock
        self._token = token
        self._max_frame = max_frame
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._authenticated = False  # a request with the token succeeded on this connection
        self._redial: tuple[tuple[str, int] | str, float] | None = None  # (address, timeout)

    @classmethod
    def connect(cls, address: tuple[str, int] | str, token: str | None = None,
                timeout: float = 60.0) -> AgentKvClient:
        client = cls(_dial(address, timeout), token)
        client._redial = (address, timeout)
        return client

    def close(self) -> None:
        self._sock.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("server closed the connection")
            got += k
        return bytes(buf)

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        """Send one request and return its ``result``; raises ``RemoteError`` on error replies."""
        with self._lock:
            if self._token is not None and not self._authenticated and op != "hello":
                self._hello_locked()
            rid = next(self._ids)
            return self._exchange(rid, p.encode_request(rid, op, args or {}, self._token))

    def _hello_locked(self) -> None:
        """Authenticate the connection with a small ``hello`` before its first request:
        the server's pre-auth limits (frame size, idle time, connections per address) then
        never apply to a request. A connection the server closed or refused as busy before
        that is dialled again (``HELLO_RETRIES``, backing off), so no request is sent
        twice. A bad token is still refused by the request itself, as before."""
        for attempt in range(HELLO_RETRIES + 1):
            try:
                hello = next(self._ids)
                self._exchange(hello, p.encode_request(hello, "hello", {}, self._token))
                return
            except (ConnectionError, p.RemoteError) as exc:
                busy = isinstance(exc, p.RemoteError) and exc.code == p.ErrorCode.BUSY.value
                if self._redial is None or attempt == HELLO_RETRIES or not (
                        busy or isinstance(exc, ConnectionError)):
                    raise
            _back_off(0.05, attempt)
            self._sock.close()
            self._sock = _dial(*self._redial)

    def _exchange(self, rid: int, frame: bytes) -> Any:
        """Send one frame and read its reply (the caller holds the lock). A frame over the
        limit is refused here, unsent (the server would close the connection on it)."""
        if len(frame) - p.HEADER.size > self._max_frame:
            raise p.ProtocolError(p.ErrorCode.OVERSIZED, f"request of {len(frame)} bytes "
                                  f"exceeds the {self._max_frame}-byte frame limit: nothing "
                                  "was sent; send fewer pages per call")
        self._sock.sendall(frame)
        length = p.frame_length(self._recv_exact(p.HEADER.size), self._max_frame)
        reply = p.decode_reply(self._recv_exact(length), self._max_frame)
        if reply.get("id") != rid:
            raise p.ProtocolError(p.ErrorCode.MALFORMED, f"reply id {reply.get('id')} != {rid}")
        if self._token is not None:
            self._authenticated = True
        return reply.get("result")

    def hello(self) -> dict[str, Any]:
        return self.call("hello")

    def open_session(self, session: str) -> SessionClient:
        opened = self.call("open_session", {"session": session})
        return SessionClient(self, session, opened)


def _dial(address: tuple[str, int] | str, timeout: float) -> socket.socket:
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SessionClient(_ClosedOnExit):
    """Calls scoped to one session: the eight workflow events and the engine-side calls.
    ``opened`` is the ``open_session`` result (tenant, HBM actor, whether it may publish).
    As a context manager it closes the session on exit (``close``), exception or not."""

    def __init__(self, client: AgentKvClient, session: str,
                 opened: dict[str, Any] | None = None) -> None:
        self.client = client
        self.session = session
        self.opened = opened or {}

    def _call(self, op: str, **args: Any) -> Any:
        return self.client.call(op, {"session": self.session, **args})

    def close(self) -> dict[str, Any]:
        """Close the session (``close_session``, docs/protocol.md): its pages go as its
        task's end would retire them, and the service forgets it. Idempotent: closing
        again answers ``closed`` false. The name may be opened again, afresh."""
        return self._call("close_session")

    # -- orchestrator events (field names follow agentkv_cluster.lifecycle.events) --
    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        return self._call("event", event={"kind": kind, **fields})

    def task_start(self, **fields: Any) -> dict[str, Any]:
        return self.event("task_start", **fields)

    def model_call(self, **fields: Any) -> dict[str, Any]:
        return self.event("model_call", **fields)

    def tool_start(self, **fields: Any) -> dict[str, Any]:
        return self.event("tool_start", **fields)

    def observation_return(self, **fields: Any) -> dict[str, Any]:
        return self.event("observation_return", **fields)

    def branch_create(self, **fields: Any) -> dict[str, Any]:
        return self.event("branch_create", **fields)

    def verification_pass(self, **fields: Any) -> dict[str, Any]:
        return self.event("verification_pass", **fields)

    def rollback(self, **fields: Any) -> dict[str, Any]:
        return self.event("rollback", **fields)

    def task_end(self, **fields: Any) -> dict[str, Any]:
        return self.event("task_end", **fields)

    # -- engine side ------------------------------------------------------------------
    def store_pages(self, pages: list[dict[str, Any]]) -> list[bytes]:
        """Each page: ``identity`` (PageIdentity.pack()), ``data`` (bytes), ``state_type``,
        optionally ``shape``, ``dtype``, ``page_id`` and ``structured`` (True: the page
        feeds code or JSON output and is kept exact; docs/protocol.md).
        Returns their keys once every page is held; ``PageLostError`` when the HBM actors
        taking them kept dying (none of the call's pages is to be relied on)."""
        return self._call("store_pages", pages=pages)["keys"]

    def lookup_prefix(self, identities: list[bytes]) -> dict[str, Any]:
        """Longest leading run of ``identities`` the service holds compatibly."""
        return self._call("lookup_prefix", identities=identities)

    def prepare_load(self, keys: list[bytes]) -> dict[str, Any]:
        return self._call("prepare_load", keys=keys)

    def complete_load(self, load_id: int) -> dict[str, Any]:
        """The load's pages, in as many replies as the frame limit needs (``start`` and
        ``next``: docs/protocol.md)."""
        pages: list[dict[str, Any]] = []
        start: int | None = 0
        while start is not None:
            reply = self._call("complete_load", load_id=load_id, start=start)
            pages += reply["pages"]
            start = reply.get("next")
        return {"pages": pages}

    def load(self, keys: list[bytes]) -> list[bytes]:
        """prepare + complete in one go; returns page bytes in ``keys`` order. A load whose
        pages left HBM between the two (pins revoked for another tenant, or timed out:
        ``complete_load`` answers ``not_found``) is prepared again, backing off, up to
        ``LOAD_ATTEMPTS`` times in all; a ``not_found`` of ``prepare_load`` itself (the
        session is not open, a key is not stored) is raised at once, and so is its
        ``page_lost`` (``PageLostError``: a page has no copy left; recompute it)."""
        for attempt in range(LOAD_ATTEMPTS):
            prep = self.prepare_load(keys)
            try:
                done = self.complete_load(prep["load_id"])
            except p.RemoteError as exc:
                if exc.code != p.ErrorCode.NOT_FOUND.value or attempt == LOAD_ATTEMPTS - 1:
                    raise
                _back_off(0.02, attempt)
                continue
            return [pg["data"] for pg in done["pages"]]
        raise AssertionError("unreachable: the last attempt returns or raises")

    def release(self, keys: list[bytes]) -> int:
        return self._call("release", keys=keys)["released"]
