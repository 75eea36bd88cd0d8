"""What the service backend keeps per agent session, bounded (no I/O here).

An engine serves an open-ended stream of agent sessions, so this is a least-recently-used
map over (token, session) of at most ``cap`` entries, like a connection pool's idle
limit. Sessions of one token share one connection (``AgentKvClient``); a connection goes
when the last cached session on it was evicted and no call is using it (``lease`` /
``release``), so an eviction never breaks a call in flight. Evicting a session only
drops what this process knows of it: the service keeps the session, its task and its
pages (an agent waiting on a long tool call is idle, not gone), and the next request of
the session opens it again. The caller holds its own lock around every method and
closes the connections these methods return.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from agentkv_cluster.api.client import AgentKvClient, SessionClient

DEFAULT_MAX_SESSIONS = 1024


@dataclass(slots=True)
class SessionEntry:
    """One cached session: its client, and what the service was told of it."""

    client: SessionClient
    started: bool = False  # its task was started on the service (an event was sent)
    tool_call: str = ""  # call id of its last tool_start: an observation_return's default


@dataclass(slots=True, eq=False)
class Connection:
    client: AgentKvClient
    sessions: int = 0  # cached sessions on it
    busy: int = 0  # calls in flight on it (leased)
    retired: bool = False  # no longer in the map: closed once not busy


class SessionCache:
    """(token, session) -> ``SessionEntry``, least recently used first, at most ``cap``."""

    def __init__(self, cap: int = DEFAULT_MAX_SESSIONS) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self._entries: OrderedDict[tuple[str, str], SessionEntry] = OrderedDict()
        self._conns: dict[str, Connection] = {}
        self.evicted = 0  # sessions dropped for room, ever

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def connections(self) -> int:
        return len(self._conns)

    def get(self, token: str, session: str) -> SessionEntry | None:
        """The session's entry (now the most recently used), or None."""
        entry = self._entries.get((token, session))
        if entry is not None:
            self._entries.move_to_end((token, session))
        return entry

    def connection(self, token: str) -> AgentKvClient | None:
        conn = self._conns.get(token)
        return None if conn is None else conn.client

    def add(self, token: str, session: SessionClient) -> tuple[SessionEntry, list[AgentKvClient]]:
        """Cache ``session`` (opened on ``token``'s connection, which is kept from now on);
        returns its entry and the connections the evictions left unused, to close."""
        conn = self._conns.get(token)
        if conn is None:
            conn = self._conns[token] = Connection(session.client)
        elif conn.client is not session.client:
            raise ValueError("a session of this token opened on another connection")
        entry = SessionEntry(session)
        key = (token, session.session)
        if key not in self._entries:
            conn.sessions += 1
        self._entries[key] = entry
        self._entries.move_to_end(key)
        unused: list[AgentKvClient] = []
        while len(self._entries) > self.cap:
            (old_token, _), _ = self._entries.popitem(last=False)
            self.evicted += 1
            unused += self._drop_session(old_token)
        return entry, unused

    def discard(self, token: str, session: str) -> list[AgentKvClient]:
        """Forget the session (it ended); returns the connection it left unused, to close."""
        if self._entries.pop((token, session), None) is None:
            return []
        return self._drop_session(token)

    def lease(self, token: str) -> Connection | None:
        """Mark a call in flight on ``token``'s connection (``release`` when it ends)."""
        conn = self._conns.get(token)
        if conn is not None:
            conn.busy += 1
        return conn

    def release(self, conn: Connection | None) -> list[AgentKvClient]:
        """The call ended: a connection retired meanwhile is now to close."""
        if conn is None:
            return []
        conn.busy -= 1
        return [conn.client] if conn.retired and conn.busy == 0 else []

    def clear(self) -> list[AgentKvClient]:
        """Forget every session (the service failed or came back empty); every
        connection is to close, also one in use (its call fails as the service did)."""
        clients = [c.client for c in self._conns.values()]
        for conn in self._conns.values():
            conn.retired = True
        self._entries.clear()
        self._conns.clear()
        return clients

    def _drop_session(self, token: str) -> list[AgentKvClient]:
        conn = self._conns[token]
        conn.sessions -= 1
        if conn.sessions > 0:
            return []
        return self._retire(token)

    def _retire(self, token: str) -> list[AgentKvClient]:
        conn = self._conns.pop(token)
        conn.retired = True
        return [conn.client] if conn.busy == 0 else []
