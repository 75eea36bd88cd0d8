"""Prometheus metrics of the service and the HTTP endpoint that serves them.

Label cardinality is bounded: the first ``top_tenants`` tenants seen keep their own
label, every later tenant is counted under ``"other"``; tiers and sources come from
closed enums. ``/healthz`` says the process is alive, ``/readyz`` runs a readiness
callback (Ray connected, directory reachable), ``/metrics`` is the exposition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

OTHER = "other"
RESTORE_SOURCES = ("hbm", "host", "nvme", "remote", "recompute")
DELAY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class TenantLabels:
    """Maps tenant ids to at most ``top_n`` distinct labels plus ``"other"``."""

    def __init__(self, top_n: int) -> None:
        self.top_n = top_n
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        with self._lock:
            if tenant in self._known:
                return tenant
            if len(self._known) < self.top_n and tenant != OTHER:
                self._known.add(tenant)
                return tenant
        return OTHER


class ServiceMetrics:
    """Every metric the service exports, in one private registry."""

    def __init__(self, top_tenants: int = 20) -> None:
        self.registry = CollectorRegistry()
        self.tenant = TenantLabels(top_tenants)
        r = self.registry
        self.restore_delay = Histogram(
            "agentkv_restore_delay_seconds", "Visible restore delay by source",
            ["tenant", "source"], buckets=DELAY_BUCKETS, registry=r)
        self.hidden_fraction = Gauge(
            "agentkv_hidden_fraction", "Fraction of restore work hidden in tool gaps",
            ["tenant"], registry=r)
        self.transfer_bytes = Counter(
            "agentkv_transfer_bytes", "Bytes moved into a tier", ["tenant", "tier"], registry=r)
        self.pages_by_codec = Counter(
            "agentkv_pages_compressed", "Pages written per compression level",
            ["tenant", "codec"], registry=r)
        self.verification_rejects = Counter(
            "agentkv_verification_rejects", "Restores rejected by verification or seal",
            ["tenant", "tier"], registry=r)
        self.recompute_tokens = Counter(
            "agentkv_recompute_tokens", "Tokens the engine must re-prefill", ["tenant"], registry=r)
        self.credit_wait = Histogram(
            "agentkv_credit_wait_seconds", "Time a restore waited for link credit",
            ["tier"], buckets=DELAY_BUCKETS, registry=r)
        self.occupancy = Gauge(
            "agentkv_tier_occupancy_bytes", "Bytes resident per tier", ["tier"], registry=r)
        self.api_requests = Counter(
            "agentkv_api_requests", "Wire requests by op and result", ["op", "code"], registry=r)
        self._hidden = {}  # tenant label -> [hidden seconds, total seconds]
        self._lock = threading.Lock()

    def api_request(self, op: str, code: str) -> None:
        self.api_requests.labels(op=op, code=code).inc()

    def restore(self, tenant: str, source: str, delay_s: float, hidden_s: float) -> None:
        """One restore: ``delay_s`` visible to the engine, ``hidden_s`` overlapped with a gap."""
        if source not in RESTORE_SOURCES:
            raise ValueError(f"unknown restore source {source!r}")
        label = self.tenant(tenant)
        self.restore_delay.labels(tenant=label, source=source).observe(delay_s)
        with self._lock:
            acc = self._hidden.setdefault(label, [0.0, 0.0])
            acc[0] += hidden_s
            acc[1] += hidden_s + delay_s
            frac = acc[0] / acc[1] if acc[1] > 0 else 0.0
        self.hidden_fraction.labels(tenant=label).set(frac)

    def transfer(self, tenant: str, tier: str, nbytes: int) -> None:
        self.transfer_bytes.labels(tenant=self.tenant(tenant), tier=tier).inc(nbytes)

    def stored(self, tenant: str, codec: str) -> None:
        self.pages_by_codec.labels(tenant=self.tenant(tenant), codec=codec).inc()

    def reject(self, tenant: str, tier: str) -> None:
        self.verification_rejects.labels(tenant=self.tenant(tenant), tier=tier).inc()

    def recompute(self, tenant: str, tokens: int) -> None:
        self.recompute_tokens.labels(tenant=self.tenant(tenant)).inc(tokens)

    def waited(self, tier: str, seconds: float) -> None:
        """One credit wait on the link into ``tier``."""
        self.credit_wait.labels(tier=tier).observe(seconds)

    def set_occupancy(self, tier: str, nbytes: int) -> None:
        self.occupancy.labels(tier=tier).set(nbytes)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsHttpServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on one port, served from a daemon thread."""

    def __init__(self, metrics: ServiceMetrics, ready: Callable[[], tuple[bool, str]],
                 host: str = "127.0.0.1", port: int = 9420,
                 refresh: Callable[[], None] | None = None) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    outer.refresh_now()
                    self._send(200, outer.metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._send(200, b"ok\n")
                elif path == "/readyz":
                    try:
                        ok, detail = outer.ready()
                    except Exception as exc:  # noqa: BLE001 - readiness probe must answer
                        ok, detail = False, f"{type(exc).__name__}: {exc}"
                    self._send(200 if ok else 503, (detail + "\n").encode())
                else:
                    self._send(404, b"not found\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # keep probes out of the logs
                return

        self.metrics = metrics
        self.ready = ready
        self.refresh = refresh
        self._refreshing = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="agentkv-metrics")

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
