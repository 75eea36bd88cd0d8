"""The only module that touches ``cryptography.hazmat``.

Everything else in ``security`` uses these few small wrappers, so the set of
primitives (AES-256-GCM, HKDF-SHA256, Ed25519, and AES-256-CTR keystream for padding) is
reviewed in one place.
"""

from __future__ import annotations

import os
import threading

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
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


_NOISE_SMALL = 4096  # below this, padding is drawn from the OS CSPRNG directly
_NOISE_ZEROS = bytes(64 << 10)


def fill_noise(dst: memoryview) -> None:
    """Fill ``dst`` with bytes that look like ciphertext: the OS CSPRNG for a few KiB, else
    an AES-256-CTR keystream under a fresh random key (never stored). Record padding is
    filled so: zeros would show where the sealed data ends, and so the true length."""
    n = len(dst)
    if n <= _NOISE_SMALL:
        dst[:] = random_bytes(n)
        return
    stream = Cipher(algorithms.AES(random_bytes(KEY_BYTES)), modes.CTR(bytes(16))).encryptor()
    step = len(_NOISE_ZEROS)
    for pos in range(0, n, step):
        k = min(step, n - pos)
        dst[pos:pos + k] = stream.update(_NOISE_ZEROS[:k])


class _NonceDraw:
    """Random nonces from the OS CSPRNG, drawn 4 KiB at a time (one system call per ~70
    chunked records instead of one per record). Nonces are public, so holding the next
    ones in memory reveals nothing; what matters is that none is handed out twice: takes
    are serialised, and a forked child drops what its parent drew (it would otherwise
    hand out the parent's next nonces under the parent's inherited data keys)."""

    BLOCK = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._buf):
                self._buf, at = random_bytes(max(self.BLOCK, n)), 0
            self._at = at + n
            return self._buf[at:at + n]

    def drop(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at fork stays held
        self._buf, self._at = b"", 0


_NONCES = _NonceDraw()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_NONCES.drop)


def random_nonces(count: int) -> bytes:
    """``count`` fresh random 96-bit nonces, concatenated (for one record's chunks)."""
    return _NONCES.take(NONCE_BYTES * count)


# ``nonce_bytes(12 * count)``: ``random_nonces`` without its frame, for the sealing hot path.
nonce_bytes = _NONCES.take


def hkdf_sha256(key: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key)


# What ``Aead.fast_decrypt_into`` raises for a message that does not open (a tag mismatch,
# or a length the cipher refuses); callers map it to ``InvalidSeal``.
OPEN_FAILED = (InvalidTag, ValueError)


class Aead:
    """AES-256-GCM with one key; ``*_into`` write into caller buffers.

    ``fast_encrypt_into`` / ``fast_decrypt_into`` are the primitive's own bound methods
    (same arguments; decryption raises one of ``OPEN_FAILED``): a hot loop sealing many
    chunks per record calls them without a wrapper frame per chunk."""

    __slots__ = ("_gcm", "fast_decrypt_into", "fast_encrypt_into")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError("AES-256-GCM needs a 32-byte key")
        self._gcm = AESGCM(key)
        if HAS_INTO:
            self.fast_encrypt_into = self._gcm.encrypt_into
            self.fast_decrypt_into = self._gcm.decrypt_into
        else:  # pragma: no cover - only on cryptography < 45
            self.fast_encrypt_into = self.encrypt_into
            self.fast_decrypt_into = self._decrypt_into_or_raise

    def _decrypt_into_or_raise(self, nonce: bytes, data, aad: bytes, out) -> None:  # pragma: no cover
        out[:] = self._gcm.decrypt(nonce, bytes(data), aad)

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
