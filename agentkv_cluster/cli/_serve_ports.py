"""Whether ``agentkv serve`` can listen where it is told to, checked before Ray starts.

A port already taken used to be found only once Ray was up, several seconds later, as
``RuntimeError: API server failed to start`` or a bare ``OSError: [Errno 98] Address
already in use`` that named neither the port nor the flag. Each port is bound here the
way its server binds it (``SO_REUSEADDR``, every address the host resolves to) and let go
at once; a port taken between this check and the server's start still fails there.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from agentkv_cluster.cli import CliError


def _bind_each(host: str, port: int) -> None:
    """Bind and release ``host:port`` on every address ``host`` resolves to."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    for family, kind, proto, _name, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)


def _check(flag: str, field: str, host: str, port: int) -> None:
    try:
        _bind_each(host, port)
    except socket.gaierror as exc:
        raise CliError(f"{flag} {port}: host {host!r} ({field}) does not resolve: "
                       f"{exc.strerror}") from None
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"{flag} {port}: {where} is already in use ({field}); stop what "
                           f"listens there or pick another port (0: any free one)") from None
        raise CliError(f"{flag} {port}: cannot listen on {where} ({field}): "
                       f"{exc.strerror}") from None


def check_ports(cfg: Any) -> None:
    """Refuse, naming the flag, a fixed API or metrics port that is taken or unusable, or
    the two set to the same port on one host. Port 0 (any free port) and a Unix socket
    are not checked."""
    api, metrics = cfg.api, cfg.metrics
    serve_metrics = metrics.enabled and metrics.port
    if not api.unix_path and api.port and serve_metrics and api.port == metrics.port \
            and api.host == metrics.host:
        raise CliError(f"--port and --metrics-port are both {api.port} on {api.host}")
    if not api.unix_path and api.port:
        _check("--port", "api.port", api.host, api.port)
    if serve_metrics:
        _check("--metrics-port", "metrics.port", metrics.host, metrics.port)
