"""A remote NIXL UCX endpoint in its own process: owns one registered buffer.

The contract tests and ``benchmarks/bench_store.py`` start it with
``multiprocessing`` (spawn) to move bytes across a real process boundary; it
doubles as a link check between two hosts. Commands arrive on a pipe.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from store.buffers import aligned_buffer
from store.transport.base import Region


def serve_peer(conn: Connection, size: int) -> None:
    """Peer main: send (metadata, packed region), learn the initiator, answer commands."""
    from store.transport.nixl_ucx import NixlUcxTransport

    transport = NixlUcxTransport()
    buf = aligned_buffer(size)  # pre-faulted; 2 MiB pages where the kernel allows
    region = transport.register(buf)
    conn.send((transport.agent_metadata(), region.pack()))
    transport.add_peer(conn.recv())
    while True:
        command, *args = conn.recv()
        if command == "fill":
            offset, data = args
            buf[offset : offset + len(data)] = np.frombuffer(data, np.uint8)
            conn.send(None)
        elif command == "read":
            offset, length = args
            conn.send(buf[offset : offset + length].tobytes())
        elif command == "notifications":
            conn.send(transport.take_notifications())
        else:  # "stop"
            transport.close()
            conn.send(None)
            return


class PeerProcess:
    """Starts ``serve_peer`` in a spawned process and introduces ``transport`` to it."""

    def __init__(self, transport: Any, size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=serve_peer, args=(child, size), daemon=True)
        self._proc.start()
        child.close()
        metadata, packed = self._recv(60.0)
        self.name = transport.add_peer(metadata)
        self.region = Region.unpack(packed)
        self._conn.send(transport.agent_metadata())

    def _recv(self, timeout_s: float) -> Any:
        if not self._conn.poll(timeout_s):
            self.close()
            raise TimeoutError("UCX peer process did not answer")
        return self._conn.recv()

    def _ask(self, *command: Any) -> Any:
        self._conn.send(command)
        return self._recv(60.0)

    def fill(self, offset: int, data: bytes) -> None:
        self._ask("fill", offset, data)

    def read(self, offset: int, length: int) -> bytes:
        return self._ask("read", offset, length)

    def notifications(self) -> dict[str, list[bytes]]:
        return self._ask("notifications")

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("stop",))
                self._conn.poll(10.0)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(10.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._conn.close()
