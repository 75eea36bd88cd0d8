"""The HTTP endpoint of the service's metrics: ``/metrics``, ``/healthz``, ``/readyz``.

``GET`` and ``HEAD`` answer on the three paths; any other method there is ``405`` with an
``Allow`` header, and any other path is ``404`` (plain text, never the stdlib's HTML page).
Each connection has its own thread, and a client cannot hold one for ever: every read or
write on its socket times out after ``read_timeout_s``, and the request line and headers must
all arrive within ``header_deadline_s`` (a client trickling a byte at a time is cut).
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # only for the signature; metrics.py re-exports this module's server
    from agentkv_cluster.api.metrics import ServiceMetrics

log = logging.getLogger(__name__)

PATHS = ("/metrics", "/healthz", "/readyz")
ALLOW = "GET, HEAD"
READ_TIMEOUT_S = 10.0  # one read or write on a probe's socket (k8s probes time out at 1-3 s)
HEADER_DEADLINE_S = 10.0  # the whole request line and headers
DRAIN_LIMIT = 64 << 10  # body bytes of a refused request read before answering


class MetricsHttpServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on one port, served from a daemon thread."""

    def __init__(self, metrics: ServiceMetrics, ready: Callable[[], tuple[bool, str]],
                 host: str = "127.0.0.1", port: int = 9420,
                 refresh: Callable[[], None] | None = None, *,
                 read_timeout_s: float = READ_TIMEOUT_S,
                 header_deadline_s: float = HEADER_DEADLINE_S,
                 alive: Callable[[], tuple[bool, str]] | None = None) -> None:
        self.metrics = metrics
        self.ready = ready
        self.alive = alive  # /healthz: None, the process answering is enough
        self.refresh = refresh
        self._refreshing = threading.Lock()
        server = _server_class(host)
        self._httpd = server((host, port), _handler(self, read_timeout_s, header_deadline_s))
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="agentkv-metrics")

    def answer(self, path: str) -> tuple[int, bytes, str]:
        """Status, body and content type of ``GET path`` (``HEAD`` sends the same headers)."""
        if path == "/metrics":
            self.refresh_now()
            return 200, self.metrics.exposition(), CONTENT_TYPE_LATEST
        if path == "/healthz":
            ok, detail = (True, "ok") if self.alive is None else self.alive()
            return (200 if ok else 503), (detail + "\n").encode(), "text/plain"
        if path == "/readyz":
            try:
                ok, detail = self.ready()
            except Exception as exc:  # noqa: BLE001 - readiness probe must answer
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            return (200 if ok else 503), (detail + "\n").encode(), "text/plain"
        return 404, b"not found\n", "text/plain"

    def refresh_now(self) -> None:
        """Pull gauges and counters that live in the actors; a failure keeps the last values
        (the scrape must still answer). Concurrent scrapes refresh once."""
        if self.refresh is None or not self._refreshing.acquire(blocking=False):
            return
        try:
            self.refresh()
        except Exception:  # stale figures beat a failed scrape
            log.warning("metrics refresh failed", exc_info=True)
        finally:
            self._refreshing.release()

    def start(self) -> MetricsHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = socket.SOMAXCONN  # the stdlib's 5 drops SYNs of a burst (1 s retries)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client gone mid-answer (reset, cut at its deadline): not worth a traceback."""
        log.debug("metrics client %s dropped: %r", client_address, sys.exc_info()[1])


class _V6Server(_Server):
    address_family = socket.AF_INET6


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    """An IPv6 listener for an IPv6 host (``::``, ``::1``): the stdlib one is IPv4 only."""
    return _V6Server if ":" in host else _Server


def _handler(outer: MetricsHttpServer, read_timeout_s: float,
             header_deadline_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = read_timeout_s  # StreamRequestHandler.setup puts it on the socket

        def setup(self) -> None:
            super().setup()
            self._expired = False
            self._deadline = threading.Timer(header_deadline_s, self._cut)
            self._deadline.daemon = True
            self._deadline.start()

        def parse_request(self) -> bool:  # reads the headers: the deadline ends here
            try:
                return super().parse_request() and not self._expired
            finally:
                self._deadline.cancel()

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def _cut(self) -> None:
            self._expired = True  # headers cut short by EOF are not a request
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:  # already gone
                pass

        def do_GET(self) -> None:
            self._send(*outer.answer(self._path()))

        def do_HEAD(self) -> None:
            self._send(*outer.answer(self._path()), head=True)

        def _refuse(self) -> None:
            self._drain()
            if self._path() in PATHS:
                self._send(405, b"method not allowed\n", "text/plain", allow=True)
            else:
                self._send(404, b"not found\n", "text/plain")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

        def _path(self) -> str:
            return self.path.split("?", 1)[0]

        def _drain(self) -> None:
            """Read a small body first: closing on unread bytes resets the connection and
            the client may never see the answer."""
            try:
                length = int(self.headers.get("Content-Length", 0))
            except ValueError:
                length = 0
            if 0 < length <= DRAIN_LIMIT:
                self.rfile.read(length)
            self.close_connection = True

        def _send(self, code: int, body: bytes, ctype: str, *, head: bool = False,
                  allow: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if allow:
                self.send_header("Allow", ALLOW)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep probes out of the logs
            return

    return Handler
