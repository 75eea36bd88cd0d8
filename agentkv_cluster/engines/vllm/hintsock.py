"""Standalone lifecycle hints: an agent framework reports ``tool_start`` (and any other
event) while the tool runs, without a model request to carry it.

With the service backend the framework sends them through the AgentKV client. With the
embedded backend the store lives inside the engine: the connector's scheduler side then
listens on a unix datagram socket (``hint_socket`` in the connector settings) and reads
it, without blocking, every engine step. A datagram is the JSON of the same object a
request carries in ``kv_transfer_params`` (``{"agentkv": {"session", "token",
"events"}}``); the tenant comes from the verified token, as for requests. A hint that does
not parse is counted and logged, never applied; the socket is readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

from agentkv_cluster.engines.vllm.hints import KEY

MAX_DATAGRAM = 64 * 1024


class HintSocket:
    """The receiving end (in the engine's scheduler process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o077)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        self._sock.setblocking(False)

    def drain(self, limit: int = 256) -> list[Any]:
        """The hints received since the last call (decoded JSON; ``None`` if not JSON)."""
        out: list[Any] = []
        while len(out) < limit:
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            try:
                out.append(json.loads(data))
            except (UnicodeDecodeError, ValueError):
                out.append(None)
        return out

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def send_hint(path: str, hints: dict[str, Any]) -> None:
    """Send ``hints`` (``{"session": ..., "token": ..., "events": [...]}``) to an engine's
    hint socket. Raises ``OSError`` when no engine listens there."""
    data = json.dumps({KEY: hints}).encode()
    if len(data) > MAX_DATAGRAM:
        raise ValueError("hint too large")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, path)
