"""The exceptions of ``security``: one per failure a caller must tell apart.

Messages never contain key material.
"""

from __future__ import annotations

from pathlib import Path


class SecurityError(Exception):
    """Base class of every error raised by ``security``."""


class InvalidSeal(SecurityError):
    """A sealed page failed to open: wrong key, tenant, slot, generation, tier or tampering.

    Callers treat it as a cache miss; the reason is deliberately not distinguished.
    """


class KeyUnavailable(SecurityError):
    """A key does not exist (never created, or destroyed by erasure)."""


class KeyExists(SecurityError):
    """A key with that name already exists; keys are never overwritten."""


class InvalidName(SecurityError, ValueError):
    """A tenant, namespace or key name that does not match the allowed pattern."""


class InvalidToken(SecurityError):
    """A principal token that is malformed, forged, or expired."""


class AccessDenied(SecurityError):
    """A principal asked for a namespace it may not use."""


class InvalidReceipt(SecurityError):
    """An erasure receipt that is malformed or whose signature does not verify."""


class AuditLogError(SecurityError):
    """The audit log cannot be appended to (for example its tail is corrupt)."""


class AuditRecordTooLarge(AuditLogError):
    """A line of the log is longer than ``limit`` bytes, the longest record line the
    writer writes (``audit_format.MAX_LINE_BYTES``): the file is corrupt or hostile.
    Reading stopped at the bound."""

    def __init__(self, lineno: int, offset: int, limit: int, path: Path | None = None) -> None:
        self.lineno, self.offset, self.limit, self.path = lineno, offset, limit, path
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}line {lineno} (byte offset {offset}) is longer than the "
                         f"maximum record line of {limit} bytes (corrupt or hostile); "
                         "not read further")

    def __reduce__(self) -> tuple[type[AuditRecordTooLarge], tuple[int, int, int, Path | None]]:
        return AuditRecordTooLarge, (self.lineno, self.offset, self.limit, self.path)


class ErasureUnrecorded(SecurityError):
    """An erasure destroyed its keys and ran its deleters, but the audit log refused the
    record its receipt points at (a disk that filled meanwhile): no receipt was signed.
    The same erasure run again once the log takes writes finishes it (the log's
    ``erasure.begun`` record says what it destroyed) and signs the receipt."""


class InvalidSigningKey(SecurityError):
    """A signing or public key file that cannot be loaded."""
