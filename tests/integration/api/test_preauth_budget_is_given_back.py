"""The shared pre-auth budget a large unauthenticated
frame reserves is given back once the frame is read: a peer sending such frames one
after another, each answered, never drains it (else, with the budget spent for good,
every later large first frame, anyone's, was refused as busy)."""

from __future__ import annotations

import socket
from dataclasses import replace

import msgpack
import pytest

from agentkv_cluster.api import protocol as p
from agentkv_cluster.api.server import PreAuthLimits
from tests.integration.api.test_wire_fuzz import _recv
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _reply(sock: socket.socket) -> dict:
    (length,) = p.HEADER.unpack(_recv(sock, p.HEADER.size))
    return msgpack.unpackb(_recv(sock, length))


def test_large_unauthenticated_frames_one_after_another_keep_the_budget() -> None:
    with local_service("agentkv-budget-", page_bytes=1 << 16, hbm_pages=4,
                       pool_bytes=1 << 20) as svc:
        svc.server.preauth = replace(PreAuthLimits(), max_frame=1024, budget_bytes=4096)
        with socket.create_connection(svc.address, timeout=5.0) as raw:
            for _ in range(4):  # 4 x 2 KiB: twice the budget, one frame at a time
                raw.sendall(p.HEADER.pack(2048) + b"\xc1" * 2048)  # not msgpack
                reply = _reply(raw)
                assert reply["error"]["code"] != "busy", reply
        assert svc.server._budget_used == 0
