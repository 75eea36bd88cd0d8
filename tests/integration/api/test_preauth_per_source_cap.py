"""One address flooding the server with unauthenticated
connections loses its own oldest ones (``PreAuthLimits.per_source``), never another
peer's: without the per-peer cap the global one evicted the oldest of all, so a flood
from one address closed every other peer's connection still authenticating."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest

from agentkv_cluster.api.server import PreAuthLimits
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _connect(address: tuple[str, int], source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(address)
    time.sleep(0.05)  # registered by the server in arrival order
    return sock


def test_a_flood_from_one_address_evicts_only_its_own_connections() -> None:
    with local_service("agentkv-persource-", page_bytes=1 << 16, hbm_pages=4,
                       pool_bytes=1 << 20) as svc:
        svc.server.preauth = replace(PreAuthLimits(), per_source=2, max_connections=4)
        port = svc.address[1]
        other = _connect(("127.0.0.1", port), "127.0.0.2")
        flood = [_connect(("127.0.0.1", port), "127.0.0.1") for _ in range(6)]
        try:
            other.settimeout(0.3)
            with pytest.raises(TimeoutError):  # still open: nothing to read, no EOF
                other.recv(1)
            closed = 0
            for sock in flood[:-2]:
                sock.settimeout(5.0)  # only a failing run waits it out
                try:
                    closed += sock.recv(1) == b""
                except ConnectionResetError:  # aborted by the server
                    closed += 1
            assert closed == 4  # the flood's oldest went
        finally:
            for sock in (other, *flood):
                sock.close()
