"""Ed25519 key files and canonical JSON, shared by the audit log and erasure receipts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from pathlib import Path

from security._primitives import Signer, Verifier
from security.errors import InvalidSigningKey
from security.key_sources import fsync_dir, write_all

__all__ = [
    "NonFiniteNumber",
    "Signer",
    "Verifier",
    "atomic_write",
    "canonical_json",
    "fingerprint",
    "load_signer",
    "load_verifier",
    "loads_finite",
    "write_keypair",
]


class NonFiniteNumber(ValueError):
    """JSON text holds NaN, Infinity or a number too large for a float: Python's json reads
    them, but ``canonical_json`` cannot write them back, so no hash or signature covers them."""


def canonical_json(obj: object) -> bytes:
    """Deterministic JSON bytes: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def _reject_constant(name: str) -> object:
    raise NonFiniteNumber(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumber(f"out-of-range number {text[:24]}")
    return value


def loads_finite(data: str | bytes) -> object:
    """``json.loads`` that refuses non-finite numbers (raises ``NonFiniteNumber``), and
    raises ValueError, not RecursionError, for JSON nested past the parser's stack."""
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def fingerprint(public_raw: bytes) -> str:
    """A short public name for a public key."""
    return hashlib.sha256(b"agentkv/ed25519/" + public_raw).hexdigest()[:16]


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidSigningKey(f"cannot read {what} {path}: {exc.strerror}") from None


def load_signer(path: str | os.PathLike[str]) -> Signer:
    """An Ed25519 private key from a PEM (PKCS#8) file."""
    return Signer.from_pem(_read(path, "signing key"))


def load_verifier(path: str | os.PathLike[str]) -> Verifier:
    """An Ed25519 public key from a PEM file, or a file of 32 raw bytes."""
    data = _read(path, "public key")
    return Verifier(data) if len(data) == 32 else Verifier.from_pem(data)


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, fsync: bool = True) -> None:
    """Write via a temporary file + fsync + rename, so readers see old or new, never half;
    with ``fsync`` the folder is synced after the rename too, or a power loss could bring
    the old file back (an audit head that no longer covers the records written before)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if fsync:
            fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # no stray temporary file next to the target
        raise


def write_keypair(private_path: str | os.PathLike[str], public_path: str | os.PathLike[str]) -> Signer:
    """Generate a signing key: private PEM (mode 0600) and public PEM, neither replacing a
    file (a public key may be the only one that verifies earlier receipts, and a path
    mistyped may name a signing key). Both files or neither: when the public key cannot be
    written the private one is removed."""
    if Path(private_path).resolve() == Path(public_path).resolve():
        raise InvalidSigningKey(f"the private and public key cannot both be {private_path}")
    if os.path.lexists(public_path):
        raise InvalidSigningKey(f"{public_path} exists; refusing to replace it (a public key "
                                "verifies the receipts signed before: move it aside first)")
    signer = Signer.generate()
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidSigningKey(f"{private_path} exists; refusing to overwrite a signing key") from None
    try:
        try:
            write_all(fd, signer.private_pem())
        finally:
            os.close(fd)
        atomic_write(Path(public_path), signer.public_pem())
    except BaseException:
        os.unlink(private_path)  # ours (O_EXCL): no half pair that blocks a retry
        raise
    return signer
