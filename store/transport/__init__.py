"""Transports: one job interface over NIXL UCX, NIXL POSIX and plain local copies.

NIXL is imported only by the ``nixl_*`` modules of this package, lazily, so the
rest of the store works where it is not installed.
"""

from __future__ import annotations

import importlib.util

from store.transport.base import (
    FileSpan,
    InvalidTransfer,
    MemKind,
    Region,
    TransferJob,
    TransferOp,
    TransferResult,
    TransferStatus,
    TransferTimeout,
    Transport,
    TransportClosed,
    TransportError,
    UnknownPeer,
)
from store.transport.local import LocalCopyTransport

__all__ = [
    "FileSpan",
    "InvalidTransfer",
    "LocalCopyTransport",
    "MemKind",
    "Region",
    "TransferJob",
    "TransferOp",
    "TransferResult",
    "TransferStatus",
    "TransferTimeout",
    "Transport",
    "TransportClosed",
    "TransportError",
    "UnknownPeer",
    "file_transport",
    "nixl_available",
]


def nixl_available() -> bool:
    return any(importlib.util.find_spec(n) is not None for n in ("nixl", "nixl_cu12"))


def file_transport(prefer_nixl: bool = True) -> Transport:
    """A memory<->file transport: NIXL POSIX when installed and wanted, else plain file I/O."""
    if prefer_nixl and nixl_available():
        from store.transport.nixl_posix import NixlPosixTransport

        return NixlPosixTransport()
    return LocalCopyTransport()
