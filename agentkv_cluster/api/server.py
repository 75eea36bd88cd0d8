"""The wire server: asyncio TCP (or unix socket) front of a ``ServiceBackend``.

One event loop in a background thread reads frames; backend calls run on a small
thread pool so a slow restore never blocks other connections. Every bad frame gets
an error reply; only an oversized frame (the stream cannot be resynchronised) or a
read timeout closes the connection. Nothing a client sends can stop the server.

A connection is unauthenticated until a request with a valid token (``hello`` with
``auth`` counts) succeeds; until then ``PreAuthLimits`` bound what it may cost: it must
authenticate within ``idle_s``, at most ``max_connections`` of them (``per_source`` per
peer address) exist at once, the oldest giving way to a new one, and frames above
``max_frame`` draw on one shared ``budget_bytes``. So unauthenticated peers hold at
most ``max_connections x (max_frame + 64 KiB read buffer) + budget_bytes`` of memory
(80 MiB by default) and cannot lock real clients out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.api import protocol as p
from agentkv_cluster.api.dispatch import (
    FREEING_OPS,
    OPS,
    Authenticator,
    ServiceBackend,
    TenantShares,
    dispatch,
)
from agentkv_cluster.api.errors import ServiceError, TenantErased
from agentkv_cluster.config import ApiConfig

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 900.0  # an authenticated orchestrator may sit silent through a tool call
READ_LIMIT = 1 << 16  # StreamReader buffer per connection between frames
DRAIN_S = 30.0  # how long ``stop`` waits for requests already running (a store waits 30 s)


@dataclass(frozen=True, kw_only=True)
class PreAuthLimits:
    """What an unauthenticated connection may cost (see the module doc)."""

    idle_s: float = 10.0  # authenticate within this many seconds of connecting
    max_frame: int = p.PREAUTH_MAX_FRAME  # larger ones before authentication: the budget
    budget_bytes: int = 64 << 20  # all such larger frames, buffered at once
    max_connections: int = 128  # unauthenticated connections at once (oldest evicted)
    per_source: int = 32  # of them from one peer address (oldest of that peer evicted)

    def bound_bytes(self) -> int:
        """The most memory unauthenticated peers can make the server hold."""
        return self.max_connections * (self.max_frame + READ_LIMIT) + self.budget_bytes


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    source: str
    opened: float
    authenticated: bool = False
    held: int = 0  # bytes of the pre-auth budget this connection holds now
    tenant: str | None = None  # the first tenant it authenticated as (counted against it)
    close_after: bool = False  # close once this reply is sent (a fatal ProtocolError)


class ApiServer:
    """Serve ``backend`` on ``config.unix_path`` or ``config.host:config.port``."""

    def __init__(self, config: ApiConfig, backend: ServiceBackend,
                 authenticator: Authenticator, metrics: Any | None = None,
                 preauth: PreAuthLimits | None = None) -> None:
        self.config = config
        self.preauth = preauth or PreAuthLimits()
        self._pending: OrderedDict[_Conn, None] = OrderedDict()  # unauthenticated, oldest first
        self._budget_used = 0  # pre-auth budget bytes held by frames being read
        self.backend = backend
        self.authenticator = authenticator
        self.metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="agentkv-api")
        self._shares = TenantShares(config.tenant_workers or max(1, config.workers // 2))
        self._tenant_conn_cap = config.tenant_connections or max(1, config.max_connections // 2)
        self._tenant_conns: dict[str, int] = {}
        self._running = 0  # requests handed to the pool and not done (``stop`` drains them)
        self._replying = 0  # requests read and not yet answered (``stop`` lets them answer)
        self._done = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._active = 0
        self.address: tuple[str, int] | str | None = None

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self._run, name="agentkv-api", daemon=True)
        self._thread.start()
        if not self._started.wait(10) or self.address is None:
            raise RuntimeError("API server failed to start")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._listen())
        except OSError as exc:
            log.error("API server cannot listen: %s", exc)
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    async def _listen(self) -> None:
        limit = READ_LIMIT
        if self.config.unix_path:
            self._server = await asyncio.start_unix_server(
                self._serve_conn, path=self.config.unix_path, limit=limit)
            self.address = self.config.unix_path
        else:
            self._server = await asyncio.start_server(
                self._serve_conn, self.config.host, self.config.port, limit=limit)
            self.address = self._server.sockets[0].getsockname()[:2]

    def stop(self) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            return

        async def _close() -> None:
            if self._server is not None:
                self._server.close()
            # Requests already read are answered before their connections close: their
            # replies (a ``busy`` from a stopping service included) were lost otherwise.
            deadline = loop.time() + DRAIN_S
            while self._replying and loop.time() < deadline:
                await asyncio.sleep(0.01)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # open connections: end their handlers cleanly
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(_close(), loop)
        if self._thread is not None:
            self._thread.join(DRAIN_S + 10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        # Requests already running end before the caller tears down what they call (a Ray
        # driver shut down under one ends the process with status 1, hiding why it stopped).
        with self._done:
            if not self._done.wait_for(lambda: self._running == 0, DRAIN_S):
                log.warning("%d request(s) still running %.0f s after stop", self._running,
                            DRAIN_S)

    def _finished(self, _future: Any) -> None:
        with self._done:
            self._running -= 1
            self._done.notify_all()

    # -- connections ----------------------------------------------------------------
    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        conn = _Conn(writer=writer, source=str(peer[0]) if isinstance(peer, tuple) else "local",
                     opened=time.monotonic())
        self._active += 1
        try:
            if self.config.require_auth:
                self._admit(conn)
            else:  # no tokens at all (development): nothing to wait for
                conn.authenticated = True
            if self._active > self.config.max_connections:
                await self._send(writer, p.error_reply(None, p.ErrorCode.BUSY,
                                                       "too many connections"))
                return
            await self._frames(reader, writer, conn)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the peer went away or stalled mid-frame: drop only this connection
        except asyncio.CancelledError:
            pass  # server shutdown
        except Exception:
            log.exception("connection handler failed")
        finally:
            self._active -= 1
            self._pending.pop(conn, None)
            self._give_back(conn)
            self._release_tenant(conn)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    def _admit(self, conn: _Conn) -> None:
        """Register an unauthenticated connection; over a cap, the oldest unauthenticated
        one (of the same peer when the per-peer cap is hit) is closed to make room, so
        idle sockets can never lock a real client out. Runs on the event loop."""
        limits = self.preauth
        same = [c for c in self._pending if c.source == conn.source]
        if len(same) >= limits.per_source:
            self._evict(same[0])
        while self._pending and (len(self._pending) >= limits.max_connections
                                 or self._active > self.config.max_connections):
            self._evict(next(iter(self._pending)))
        self._pending[conn] = None

    def _evict(self, conn: _Conn) -> None:
        self._pending.pop(conn, None)
        self._count("preauth", p.ErrorCode.BUSY)
        conn.writer.transport.abort()  # its handler sees the connection end

    def _promote(self, conn: _Conn | None, principal: Any) -> None:
        """The connection presented a valid token: the pre-auth limits end for it, and it
        counts against its tenant's ``api.tenant_connections`` (one tenant's idle
        connections took all of ``max_connections`` and locked the others out); over
        that, the call is refused (busy) and the connection closed."""
        if conn is None:
            return
        tenant = getattr(principal, "tenant", None)
        if conn.tenant is None and tenant is not None:
            held = self._tenant_conns.get(tenant, 0)
            if held >= self._tenant_conn_cap:
                raise p.ProtocolError(p.ErrorCode.BUSY, f"tenant {tenant} holds {held} "
                                      "connections (api.tenant_connections): close some, "
                                      "or send more requests on each", fatal=True)
            conn.tenant, self._tenant_conns[tenant] = tenant, held + 1
        if not conn.authenticated:
            conn.authenticated = True
            self._pending.pop(conn, None)

    def _release_tenant(self, conn: _Conn) -> None:
        if conn.tenant is not None:
            left = self._tenant_conns[conn.tenant] - 1
            if left:
                self._tenant_conns[conn.tenant] = left
            else:
                del self._tenant_conns[conn.tenant]
            conn.tenant = None

    def _give_back(self, conn: _Conn) -> None:
        self._budget_used -= conn.held
        conn.held = 0

    def _header_timeout(self, conn: _Conn) -> float:
        if conn.authenticated:
            return IDLE_TIMEOUT_S
        return max(0.0, conn.opened + self.preauth.idle_s - time.monotonic())

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write a reply; a peer that takes none of it for ``read_timeout_s`` is dropped
        (TimeoutError): one that sent requests and read no reply held its connection, and
        a slot of ``max_connections``, for good."""
        writer.write(data)
        while True:
            left = writer.transport.get_write_buffer_size()
            try:
                await asyncio.wait_for(writer.drain(), self.config.read_timeout_s)
                return
            except TimeoutError:
                if writer.transport.get_write_buffer_size() >= left:
                    writer.transport.abort()  # close() would wait to flush it, for good
                    raise

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      conn: _Conn) -> None:
        max_frame = self.config.max_frame_bytes
        while True:
            try:
                header = await asyncio.wait_for(reader.readexactly(p.HEADER.size),
                                                self._header_timeout(conn))
            except asyncio.IncompleteReadError:
                return  # clean EOF between frames (or a torn header)
            try:
                length = p.frame_length(header, max_frame)
                self._reserve(conn, length)
            except p.ProtocolError as exc:
                self._count("frame", exc.code)
                await self._send(writer, p.error_reply(None, exc.code, exc.message))
                if exc.fatal:
                    return
                continue
            timeout = self.config.read_timeout_s
            if not conn.authenticated:
                timeout = min(timeout, max(0.1, self._header_timeout(conn)))
            try:
                payload = await asyncio.wait_for(reader.readexactly(length), timeout)
            finally:
                self._give_back(conn)
            self._replying += 1
            try:
                await self._send(writer, await self._handle(payload, conn))
                if conn.close_after:
                    return
            finally:
                self._replying -= 1

    def _reserve(self, conn: _Conn, length: int) -> None:
        """Before authentication, a frame above ``preauth.max_frame`` must fit the shared
        budget, or the connection is refused (BUSY) and closed."""
        if conn.authenticated or length <= self.preauth.max_frame:
            return
        if self._budget_used + length > self.preauth.budget_bytes:
            raise p.ProtocolError(
                p.ErrorCode.BUSY, f"frames over {self.preauth.max_frame} bytes need an "
                "authenticated connection now (send hello with auth first)", fatal=True)
        self._budget_used += length
        conn.held = length

    async def _handle(self, payload: bytes, conn: _Conn | None = None) -> bytes:
        max_frame = self.config.max_frame_bytes
        try:
            req = p.decode_request(payload, max_frame)
        except p.ProtocolError as exc:
            self._count("decode", exc.code)
            return p.error_reply(exc.request_id, exc.code, exc.message)
        op = req.op if req.op in OPS else "unknown"
        started = time.perf_counter()
        try:
            result = await self._execute(req, conn)
            reply = p.ok_reply(req.request_id, result)
        except p.ProtocolError as exc:
            self._count(op, exc.code, started)
            if exc.fatal and conn is not None:  # as for a bad frame: closed after the reply
                conn.close_after = True
            return p.error_reply(req.request_id, exc.code, exc.message)
        except ServiceError as exc:
            self._count(op, exc.code, started)
            return p.error_reply(req.request_id, exc.code, str(exc))
        except Exception as exc:
            log.exception("op %s failed", op)
            self._count(op, p.ErrorCode.INTERNAL, started)
            return p.error_reply(req.request_id, p.ErrorCode.INTERNAL, type(exc).__name__)
        self._count(op, None, started)
        return reply

    async def _execute(self, req: p.Request, conn: _Conn | None = None) -> Any:
        if req.op == "hello":
            if req.auth is not None:  # optional: authenticates the connection up front
                try:
                    principal = self._authenticate(req.auth)
                except (p.ProtocolError, TenantErased):
                    principal = None  # hello answers anyway; the connection stays unauthenticated
                if principal is not None:
                    self._promote(conn, principal)
            return {"server": "agentkv", "versions": sorted(p.SUPPORTED_VERSIONS),
                    "max_frame_bytes": self.config.max_frame_bytes,
                    "preauth_max_frame": self.preauth.max_frame}
        if req.op not in OPS:
            raise p.ProtocolError(p.ErrorCode.UNKNOWN_OP, f"unknown op {req.op[:64]!r}")
        principal = self._authenticate(req.auth)
        if req.auth is not None:
            self._promote(conn, principal)
        if req.op in FREEING_OPS:
            return await self._run_call(principal, req)
        async with self._shares.turn(getattr(principal, "tenant", None)):
            return await self._run_call(principal, req)

    async def _run_call(self, principal: Any, req: p.Request) -> Any:
        with self._done:  # counted before it can finish, so the count never dips below 0
            self._running += 1
        try:
            job = self._pool.submit(dispatch, self.backend, principal, req.op, req.args)
        except BaseException:  # the pool is shut down: nothing will run
            self._finished(None)
            raise
        job.add_done_callback(self._finished)  # cancelled at stop, too
        return await asyncio.wrap_future(job)

    def _authenticate(self, token: str | None) -> Any:
        if token is None:
            if self.config.require_auth:
                raise p.ProtocolError(p.ErrorCode.UNAUTHENTICATED, "missing auth token")
            return None
        try:
            return self.authenticator(token)
        except TenantErased:  # a valid token whose tenant is being erased: retry later
            raise
        except Exception:  # noqa: BLE001 - any verifier failure means "not authenticated"
            raise p.ProtocolError(p.ErrorCode.UNAUTHENTICATED, "invalid auth token") from None

    def _count(self, op: str, code: p.ErrorCode | None, started: float | None = None) -> None:
        if self.metrics is not None:
            seconds = None if started is None else time.perf_counter() - started
            self.metrics.api_request(op, code.value if code is not None else "ok", seconds)
