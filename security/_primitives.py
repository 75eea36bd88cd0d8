"""The only module that touches ``cryptography.hazmat``.

Everything else in ``security`` uses these few small wrappers, so the set of
primitives (AES-256-GCM, HKDF-SHA256, Ed25519) is reviewed in one place.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from security.errors import InvalidSeal, InvalidSigningKey

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
# cryptography >= 45 writes into caller buffers; older versions allocate and we copy.
HAS_INTO = hasattr(AESGCM, "encrypt_into") and hasattr(AESGCM, "decrypt_into")


def random_bytes(n: int) -> bytes:
    return os.urandom(n)


def hkdf_sha256(key: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key)


class Aead:
    """AES-256-GCM with one key; ``*_into`` write into caller buffers."""

    __slots__ = ("_gcm",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError("AES-256-GCM needs a 32-byte key")
        self._gcm = AESGCM(key)

    def encrypt_into(self, nonce: bytes, data, aad: bytes, out) -> None:
        """Write ciphertext ‖ tag (``len(data) + 16`` bytes) into ``out``."""
        if HAS_INTO:
            self._gcm.encrypt_into(nonce, data, aad, out)
        else:  # pragma: no cover - only on cryptography < 45
            out[:] = self._gcm.encrypt(nonce, bytes(data), aad)

    def decrypt_into(self, nonce: bytes, data, aad: bytes, out) -> None:
        """Write the plaintext (``len(data) - 16`` bytes) into ``out`` or raise InvalidSeal."""
        try:
            if HAS_INTO:
                self._gcm.decrypt_into(nonce, data, aad, out)
            else:  # pragma: no cover - only on cryptography < 45
                out[:] = self._gcm.decrypt(nonce, bytes(data), aad)
        except (InvalidTag, ValueError) as exc:
            raise InvalidSeal("sealed page does not open") from exc

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return self._gcm.encrypt(nonce, data, aad)

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        try:
            return self._gcm.decrypt(nonce, data, aad)
        except (InvalidTag, ValueError) as exc:
            raise InvalidSeal("sealed blob does not open") from exc


def raw_aesgcm(key: bytes) -> AESGCM:
    """The bare primitive, for the benchmark's side-by-side baseline only."""
    return AESGCM(key)


class Signer:
    """An Ed25519 private key."""

    __slots__ = ("_key",)

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes) -> Signer:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise InvalidSigningKey("not a PEM Ed25519 private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidSigningKey("the private key is not Ed25519")
        return cls(key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def public_raw(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def private_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public_pem(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


class Verifier:
    """An Ed25519 public key."""

    __slots__ = ("_key", "raw")

    def __init__(self, raw: bytes) -> None:
        try:
            self._key = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            raise InvalidSigningKey("not a 32-byte Ed25519 public key") from exc
        self.raw = raw

    @classmethod
    def from_pem(cls, data: bytes) -> Verifier:
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise InvalidSigningKey("not a PEM Ed25519 public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise InvalidSigningKey("the public key is not Ed25519")
        return cls(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True
