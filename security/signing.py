"""Ed25519 key files and canonical JSON, shared by the audit log and erasure receipts."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from security._primitives import Signer, Verifier
from security.errors import InvalidSigningKey

__all__ = [
    "Signer",
    "Verifier",
    "atomic_write",
    "canonical_json",
    "fingerprint",
    "load_signer",
    "load_verifier",
    "write_keypair",
]


def canonical_json(obj: object) -> bytes:
    """Deterministic JSON bytes: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


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
    """Write via a temporary file + fsync + rename, so readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_keypair(private_path: str | os.PathLike[str], public_path: str | os.PathLike[str]) -> Signer:
    """Generate a signing key: private PEM (mode 0600, never overwritten) and public PEM."""
    signer = Signer.generate()
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidSigningKey(f"{private_path} exists; refusing to overwrite a signing key") from None
    try:
        os.write(fd, signer.private_pem())
    finally:
        os.close(fd)
    atomic_write(Path(public_path), signer.public_pem())
    return signer
