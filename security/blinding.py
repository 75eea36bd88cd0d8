"""Directory blinding: keyed-hash names and size buckets.

A directory entry key is ``akv:{<ns>}:e:<hex(HMAC-SHA256(tenant blinding secret, digest))>``
(the store's Redis layout; the braces are a literal hash tag) where ``ns`` is
itself a keyed hash of the tenant: the directory (and anyone
who reads Redis) learns neither tenant names nor identities, and the same
prefix under two tenants has two unrelated keys. Sizes are stored as
power-of-two buckets, never as plaintext lengths.
"""

from __future__ import annotations

import hashlib
import hmac

from security.errors import InvalidName
from security.keyring import TenantKeyring, validate_namespace

KEY_PREFIX = b"akv:"
MIN_BUCKET = 4096
_NS_DOMAIN = b"agentkv/ns/v1"
_KEY_DOMAIN = b"agentkv/dir/v1\0"


def size_bucket(n: int) -> int:
    """The smallest power of two >= ``n`` (at least 4 KiB): all a directory may store."""
    if type(n) is not int or n < 0:
        raise ValueError("size must be a non-negative int")
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())


class DirectoryBlinder:
    """Computes blinded namespaces and keys from the keyring's per-tenant secrets."""

    def __init__(self, keyring: TenantKeyring) -> None:
        self.keyring = keyring
        self._secrets: dict[str, bytes] = {}

    def _secret(self, tenant: str) -> bytes:
        secret = self._secrets.get(tenant)
        if secret is None:
            secret = self.keyring.blind_secret(validate_namespace(tenant))
            self._secrets[tenant] = secret
        return secret

    def forget(self, tenant: str) -> None:
        """Drop a cached secret (after erasure)."""
        self._secrets.pop(tenant, None)

    def namespace(self, tenant: str) -> str:
        """The tenant's opaque directory namespace (also its Redis ACL key prefix)."""
        return "n" + hmac.new(self._secret(tenant), _NS_DOMAIN, hashlib.sha256).hexdigest()[:24]

    def blind_key(self, tenant: str, identity_digest: bytes) -> bytes:
        """32 opaque bytes naming one page identity of one tenant."""
        if not isinstance(identity_digest, (bytes, bytearray)) or len(identity_digest) != 32:
            raise InvalidName("identity digest must be 32 bytes")
        return hmac.new(self._secret(tenant), _KEY_DOMAIN + bytes(identity_digest),
                        hashlib.sha256).digest()

    def directory_key(self, tenant: str, identity_digest: bytes) -> bytes:
        """``akv:{<ns>}:e:<hex>``: the entry key in the Redis directory."""
        blinded = self.blind_key(tenant, identity_digest).hex().encode()
        return KEY_PREFIX + b"{" + self.namespace(tenant).encode() + b"}:e:" + blinded
