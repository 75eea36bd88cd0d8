"""NixlUcxTransport: memory <-> memory across processes (DRAM here, VRAM on GPU hosts).

Peers are introduced with bytes (``agent_metadata()`` on one side,
``add_peer(metadata)`` on the other), so Ray or a pipe can carry them; a
peer's regions travel as ``Region.pack()`` bytes.
"""

from __future__ import annotations

from store.transport._nixl import NIXL_ERRORS, NixlTransportBase
from store.transport.base import InvalidTransfer, MemKind


class NixlUcxTransport(NixlTransportBase):
    """Peers know this transport by its first agent (``agent_metadata``, ``Region.owner``);
    the other lanes' agents (``_nixl.LANE_FROM``) only initiate transfers to them."""

    backend = "UCX"
    remote_kinds = frozenset({MemKind.DRAM, MemKind.VRAM})
    lanes_allowed = True

    def agent_metadata(self) -> bytes:
        """This agent's metadata, for a peer's ``add_peer``. Take it after registering
        the buffers the peer will address."""
        return self._agent.get_agent_metadata()

    def add_peer(self, metadata: bytes) -> str:
        """Introduce a remote agent; returns its name (the ``owner`` of its regions)."""
        try:
            name = self._agent.add_remote_agent(metadata)
        except NIXL_ERRORS as exc:
            raise InvalidTransfer(f"bad agent metadata: {exc!r}") from exc
        name = name.decode() if isinstance(name, bytes) else str(name)
        for agent in self._agents[1:]:
            agent.add_remote_agent(metadata)
        self._peers.add(name)
        self._peer_meta[name] = metadata
        return name

    def remove_peer(self, name: str) -> None:
        if name in self._peers and name != self.name:
            for agent in self._agents:
                agent.remove_remote_agent(name)
            self._peers.discard(name)
            self._peer_meta.pop(name, None)

    def take_notifications(self) -> dict[str, list[bytes]]:
        """Tags of jobs that peers finished writing into this agent's memory, by peer name."""
        raw = self._agent.get_new_notifs()
        return {(k.decode() if isinstance(k, bytes) else k): list(v) for k, v in raw.items()}
