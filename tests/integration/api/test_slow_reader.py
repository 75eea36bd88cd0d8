"""A peer that sends a request and never reads the reply: the server waited on the
socket's drain with no timeout, so the connection (a slot of ``api.max_connections``,
its socket and its buffered reply) was held for as long as the peer kept it open. Now a
reply that makes no progress for ``api.read_timeout_s`` drops the connection."""

from __future__ import annotations

import socket
import time

import msgpack
import numpy as np
import pytest

from agentkv_cluster.api import protocol as p
from tests.integration.runtime.test_cluster import identity
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 1 << 20
PAGES = 12  # a 12 MiB reply: more than loopback's socket buffers hold (4 MiB each)


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-slowreader-", page_bytes=PAGE, hbm_pages=2 * PAGES,
                       pool_bytes=4 * PAGE, api={"read_timeout_s": 1.0, "max_connections": 2,
                                                 "tenant_connections": 2}) as svc:
        yield svc


def _frame(body: dict) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return p.HEADER.pack(len(payload)) + payload


def test_a_peer_that_reads_no_reply_is_dropped(service) -> None:
    """Two connections allowed: the client's and the stalled one. Once the stalled reply
    has made no progress for 1 s, a second client gets in (it was refused "busy")."""
    token = service.token("acme")
    data = np.random.default_rng(0).integers(0, 255, PAGE, dtype=np.uint8).tobytes()
    with service.client("acme") as client:
        session = client.open_session("slow")
        keys = session.store_pages([{"page_id": i, "identity": identity("acme", "slow", i).pack(),
                                     "data": data} for i in range(PAGES)])
        load_id = session.prepare_load(keys)["load_id"]
        sock = socket.create_connection(service.address, timeout=10.0)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(_frame({"v": 1, "id": 1, "op": "complete_load", "auth": token,
                                 "args": {"session": "slow", "load_id": load_id}}))
            deadline = time.monotonic() + 30.0
            while True:  # never reading: the reply stalls, and then the connection goes
                time.sleep(1.0)
                try:
                    with service.client("acme") as other:
                        other.open_session("other").close()
                    break
                except p.RemoteError as exc:
                    assert "too many connections" in str(exc)
                    assert time.monotonic() < deadline, "the stalled peer kept its connection"
        finally:
            sock.close()
        assert session.load(keys[:1]) == [data]  # and the first client is still served
