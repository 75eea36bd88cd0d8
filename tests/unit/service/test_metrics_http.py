"""The metrics endpoint as probes and scrapers see it: GET and HEAD on the three paths,
clean 405 / 404 for everything else, and no client can hold a connection (a thread) for
ever, idle or trickling its headers."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from agentkv_cluster.api.metrics import MetricsHttpServer, ServiceMetrics


@pytest.fixture
def server():
    srv = MetricsHttpServer(ServiceMetrics(), lambda: (False, "directory unreachable"),
                            port=0, read_timeout_s=0.5, header_deadline_s=1.0).start()
    yield srv
    srv.stop()


def request(srv: MetricsHttpServer, method: str, path: str, body: bytes | None = None,
            host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, srv.port, timeout=5)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_head_answers_like_get_without_a_body(server) -> None:
    for path, code in (("/healthz", 200), ("/readyz", 503), ("/metrics", 200)):
        got, headers, body = request(server, "HEAD", path)
        want, want_headers, want_body = request(server, "GET", path)
        assert (got, body) == (code, b"") and want == code
        assert headers["Content-Type"] == want_headers["Content-Type"]
        if path != "/metrics":  # the exposition changes between two scrapes
            assert int(headers["Content-Length"]) == len(want_body)


def test_other_methods_get_a_plain_405_and_unknown_paths_404(server) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        for path in ("/metrics", "/healthz", "/readyz?x=1"):
            code, headers, body = request(server, method, path, body=b"x" * 1000)
            assert (code, body) == (405, b"method not allowed\n"), (method, path)
            assert headers["Allow"] == "GET, HEAD"
            assert headers["Content-Type"] == "text/plain"
        assert request(server, method, "/nope", body=b"{}")[:3:2] == (404, b"not found\n")
    assert request(server, "GET", "/nope")[:3:2] == (404, b"not found\n")


def _dropped(sock: socket.socket, within_s: float, trickle: bool = False) -> bool:
    """Whether the server closes ``sock`` within ``within_s``."""
    sock.settimeout(0.2)
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if trickle:
                sock.sendall(b"X")
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset or broken pipe: dropped as well
            return True
    return False


def test_an_idle_client_is_dropped(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as idle:
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert _dropped(idle, within_s=3.0)


def test_a_client_trickling_its_headers_is_cut_at_the_deadline(server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        assert _dropped(slow, within_s=4.0, trickle=True)  # a byte each 0.2 s: never idle
    assert request(server, "GET", "/healthz")[0] == 200


def test_a_burst_of_slow_clients_does_not_delay_the_probe(server) -> None:
    started = time.monotonic()  # a listen backlog of 5 dropped SYNs: 1 s retries each
    slow = []
    try:
        for _ in range(50):
            slow.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
            slow[-1].sendall(b"GET /readyz HTTP/1.1\r\n")
        assert request(server, "GET", "/healthz")[:3:2] == (200, b"ok\n")
        assert time.monotonic() - started < 2.0
    finally:
        for s in slow:
            s.close()


def test_an_ipv6_host_is_served() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 on this host")
    srv = MetricsHttpServer(ServiceMetrics(), lambda: (True, "ok"), host="::1", port=0).start()
    try:
        assert request(srv, "GET", "/healthz", host="::1")[:3:2] == (200, b"ok\n")
    finally:
        srv.stop()
