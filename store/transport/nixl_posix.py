"""NixlPosixTransport: memory <-> file through NIXL's POSIX backend."""

from __future__ import annotations

from store.transport._nixl import NixlTransportBase
from store.transport.base import MemKind


class NixlPosixTransport(NixlTransportBase):
    """Register memory and ``FileSpan``s; jobs move bytes between them (WRITE = to file)."""

    backend = "POSIX"
    remote_kinds = frozenset({MemKind.FILE})
    progress_thread = False
