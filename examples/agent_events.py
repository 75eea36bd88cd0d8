"""Where the agent example sends its eight workflow events.

`service_sink` uses the AgentKV Python client against a running `agentkv serve`
(tenant and session come from the token and the session, so they are not sent);
`local_sink` applies the same events to an in-process `EventGraph`, the lifecycle
code the service runs, when no service is given.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentkv_cluster.lifecycle.events import event_from_dict
from agentkv_cluster.lifecycle.graph import EventGraph

TENANT = "demo"


class EventSink:
    """Numbers, timestamps and forwards events; counts each kind sent."""

    def __init__(self, session: str, send: Callable[[str, dict[str, Any]], Any],
                 describe: str, close: Callable[[], None] = lambda: None) -> None:
        self.session = session
        self._send, self._describe, self._close = send, describe, close
        self._ids = itertools.count(1)
        self._versions = itertools.count(1)
        self._counts: Counter[str] = Counter()

    def reserve_version(self) -> int:
        """The version of an event about to be sent (pages carry it in their identity)."""
        return next(self._versions)

    def send(self, kind: str, task_id: str, version: int | None = None, **fields: Any) -> int:
        """Send one event; returns its version (event versions strictly increase)."""
        version = self.reserve_version() if version is None else version
        event = {"event_id": next(self._ids), "task_id": task_id, "version": version,
                 "ts": time.time(), **fields}
        self._send(kind, event)
        self._counts[kind] += 1
        return version

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def describe(self) -> str:
        return self._describe

    def close(self) -> None:
        self._close()


def local_sink(session: str = "agent-1") -> EventSink:
    graph = EventGraph()

    def send(kind: str, event: dict[str, Any]) -> None:
        full = {"kind": kind, "tenant": TENANT, "session": session, **event}
        graph.apply(event_from_dict(full), now=event["ts"])

    return EventSink(session, send, "in-process EventGraph (no --connect given)")


def service_sink(session_client: Any, describe: str) -> EventSink:
    """Events over an open `SessionClient` (tenant and session ride on the token/request)."""
    return EventSink(session_client.session,
                     lambda kind, event: session_client.event(kind, **event), describe)
