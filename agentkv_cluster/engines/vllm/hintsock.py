"""Standalone lifecycle hints: an agent framework reports ``tool_start`` (and any other
event) while the tool runs, without a model request to carry it.

With the service backend the framework sends them through the AgentKV client. With the
embedded backend the store lives inside the engine: the connector's scheduler side then
listens on a unix datagram socket (``hint_socket`` in the connector settings) and reads
it, without blocking, every engine step. A datagram is the JSON of the same object a
request carries in ``kv_transfer_params`` (``{"agentkv": {"session", "token",
"events"}}``); the tenant comes from the verified token, as for requests. A hint that does
not parse is counted and logged, never applied; the socket is readable by its owner only.
The engine takes the path only if nothing else is there (a stale socket of an engine that
died is replaced): another file, or a socket another engine still reads, is a
``HintSocketError`` at start; it used to be deleted, and the other engine silently
stopped receiving its hints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
from typing import Any

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.hints import KEY, AgentHints, HintError, parse_hints

log = logging.getLogger(__name__)

MAX_DATAGRAM = 64 * 1024
MAX_PATH = 107  # bytes of a unix socket path (sun_path less its terminating NUL)


class HintSocketError(OSError):
    """The ``hint_socket`` path cannot be taken (named in the message)."""


def _claim(path: str) -> None:
    """Make room at ``path``: nothing there, or a stale socket (removed); anything else
    is left alone and refused."""
    if len(os.fsencode(path)) > MAX_PATH:
        raise HintSocketError(f"hint_socket {path!r:.80} is longer than the {MAX_PATH} "
                              "bytes a unix socket path holds")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise HintSocketError(f"hint_socket {path!r:.80} exists and is not a socket; "
                              "not replaced")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:  # nobody reads it: left by an engine that died
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
    raise HintSocketError(f"hint_socket {path!r:.80} is in use by another process")


class HintSocket:
    """The receiving end (in the engine's scheduler process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        _claim(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o077)
        try:
            self._sock.bind(path)
        except OSError:
            self._sock.close()
            raise
        finally:
            os.umask(old)
        self._inode = os.stat(path).st_ino
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

    def take(self, counters: ConnectorCounters) -> list[AgentHints]:
        """The hints received since the last call that parse and carry events; each one
        received is counted (``hints_received``), each refused counted and logged."""
        out: list[AgentHints] = []
        for raw in self.drain():
            counters.add(hints_received=1)
            try:
                hints = parse_hints(raw if isinstance(raw, dict) else "not JSON")
                if not hints.events:
                    raise HintError("a standalone hint needs events")
            except HintError as exc:
                counters.add(hint_errors=1)
                log.warning("AgentKV: standalone hint ignored: %s", exc)
                continue
            except Exception:  # never into vLLM's scheduler: a datagram cannot stop it
                counters.add(hint_errors=1)
                log.exception("AgentKV: standalone hint failed to parse; ignored")
                continue
            out.append(hints)
        return out

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:  # still ours
                os.unlink(self.path)


def send_hint(path: str, hints: dict[str, Any]) -> None:
    """Send ``hints`` (``{"session": ..., "token": ..., "events": [...]}``) to an engine's
    hint socket. Raises ``OSError`` when no engine listens there."""
    data = json.dumps({KEY: hints}).encode()
    if len(data) > MAX_DATAGRAM:
        raise ValueError("hint too large")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, path)
