"""Trust: tenant keys, page sealing, erasure receipts, audit log, principals.

Imports neither ``store`` nor ``agentkv_cluster``; only ``security._primitives``
touches ``cryptography.hazmat``. See docs/security.md for the threat model.
"""

from security.audit import AuditLog, AuditPosition, VerifyReport, verify_log
from security.blinding import DirectoryBlinder, size_bucket
from security.erasure import Eraser, EraseScope, ErasureReceipt, sign_receipt, verify_receipt
from security.errors import (
    AccessDenied,
    InvalidName,
    InvalidReceipt,
    InvalidSeal,
    InvalidToken,
    KeyUnavailable,
    SecurityError,
)
from security.keyring import (
    PUBLIC_NAMESPACE,
    FileKeySource,
    KeyringConfig,
    KeySource,
    KeyWrapper,
    LocalKeyWrapper,
    TenantKeyring,
    WrappedKeySource,
)
from security.principals import AccessPolicy, Principal, TokenIssuer
from security.sealing import TenantSealer, sealed_size
from security.signing import Signer, Verifier, load_signer, load_verifier

__all__ = [
    "PUBLIC_NAMESPACE", "AccessDenied", "AccessPolicy", "AuditLog", "AuditPosition",
    "DirectoryBlinder", "EraseScope", "Eraser", "ErasureReceipt", "FileKeySource", "InvalidName",
    "InvalidReceipt", "InvalidSeal", "InvalidToken", "KeySource", "KeyUnavailable", "KeyWrapper",
    "KeyringConfig", "LocalKeyWrapper", "Principal", "SecurityError", "Signer", "TenantKeyring",
    "TenantSealer", "TokenIssuer", "Verifier", "VerifyReport", "WrappedKeySource", "load_signer",
    "load_verifier", "sealed_size", "sign_receipt", "size_bucket", "verify_log", "verify_receipt",
]
