"""Page sealing: AES-256-GCM per tenant and generation, bound to where a page lives.

``sealed = header ‖ ciphertext ‖ tag``; the 32-byte header holds magic, format
version, data-key epoch and the random nonce. The AAD is the header plus the
tenant, the page identity digest, generation, tier and slot, so a page moved to
another slot, replayed from an old generation, opened as another tenant, or
touched in any bit raises the one ``InvalidSeal``, which callers treat as a miss.
"""

from __future__ import annotations

import operator
import struct

from security import _primitives as prim
from security.errors import InvalidName, InvalidSeal, KeyUnavailable
from security.keyring import TenantKeyring, validate_generation, validate_namespace

FORMAT_VERSION = 1
MAGIC = b"AKVS"
_HEADER = struct.Struct(">4sB3sQ12s4s")  # magic, version, reserved, epoch, nonce, reserved
HEADER_BYTES = _HEADER.size
OVERHEAD = HEADER_BYTES + prim.TAG_BYTES
DIGEST_BYTES = 32
_BINDING = struct.Struct(">QBQ")  # generation, tier, slot
_ZERO3, _ZERO4 = bytes(3), bytes(4)
_MAX_SLOT = 2**64 - 1


def sealed_size(n: int) -> int:
    """Bytes a sealed page of ``n`` plaintext bytes takes."""
    if n < 0:
        raise ValueError("plaintext length cannot be negative")
    return n + OVERHEAD


def plaintext_size(sealed_len: int) -> int:
    """Plaintext bytes inside a sealed page of ``sealed_len`` bytes."""
    if sealed_len < OVERHEAD:
        raise InvalidSeal("sealed page is shorter than its header and tag")
    return sealed_len - OVERHEAD


def _bytes_view(buf: object) -> memoryview:
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
    except (TypeError, ValueError):
        raise TypeError("pages must be C-contiguous buffers (bytes, bytearray, mmap, numpy; "
                        "for a CPU torch tensor pass t.view(torch.uint8).numpy())") from None
    return view


def _binding(namespace: str, digest: object, generation: int, tier: object, slot: object) -> bytes:
    validate_namespace(namespace)
    validate_generation(generation)
    if not isinstance(digest, (bytes, bytearray)) or len(digest) != DIGEST_BYTES:
        raise InvalidName("page identity digest must be 32 bytes")
    try:
        tier_i, slot_i = operator.index(tier), operator.index(slot)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidName("tier and slot must be integers") from None
    if not 0 <= tier_i <= 255 or not 0 <= slot_i <= _MAX_SLOT:
        raise InvalidName("tier must be in 0..255 and slot in 0..2**64-1")
    name = namespace.encode()
    return bytes((len(name),)) + name + bytes(digest) + _BINDING.pack(generation, tier_i, slot_i)


class TenantSealer:
    """Seals and opens pages for every tenant of one keyring."""

    def __init__(self, keyring: TenantKeyring) -> None:
        self.keyring = keyring

    def seal(
        self,
        tenant: str,
        page_digest: bytes,
        generation: int,
        tier: int,
        slot: int,
        plaintext: object,
        out: object = None,
    ) -> bytearray | memoryview:
        """Seal ``plaintext`` into ``out`` (``sealed_size(n)`` bytes or more) or a new buffer."""
        binding = _binding(tenant, page_digest, generation, tier, slot)
        src = _bytes_view(plaintext)
        size = sealed_size(src.nbytes)
        result: bytearray | memoryview
        if out is None:
            result = bytearray(size)
            dst = memoryview(result)
        else:
            dst = _bytes_view(out)
            if dst.readonly or dst.nbytes < size:
                raise ValueError(f"out must be a writable buffer of at least {size} bytes")
            dst = result = dst[:size]
        epoch, aead = self.keyring.seal_key(tenant, generation)
        nonce = prim.random_bytes(prim.NONCE_BYTES)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, _ZERO3, epoch, nonce, _ZERO4)
        dst[:HEADER_BYTES] = header
        aead.encrypt_into(nonce, src, header + binding, dst[HEADER_BYTES:])
        return result

    def open(
        self,
        tenant: str,
        page_digest: bytes,
        generation: int,
        tier: int,
        slot: int,
        sealed: object,
        out: object = None,
    ) -> bytearray | memoryview:
        """Open a sealed page into ``out`` or a new buffer; raises ``InvalidSeal``."""
        binding = _binding(tenant, page_digest, generation, tier, slot)
        src = _bytes_view(sealed)
        size = plaintext_size(src.nbytes)
        header = bytes(src[:HEADER_BYTES])
        magic, version, res3, epoch, nonce, res4 = _HEADER.unpack(header)
        if magic != MAGIC or version != FORMAT_VERSION or res3 != _ZERO3 or res4 != _ZERO4:
            raise InvalidSeal("sealed page does not open")
        try:
            aead = self.keyring.open_key(tenant, generation, epoch)
        except KeyUnavailable as exc:  # erased or never created: indistinguishable from a bad seal
            raise InvalidSeal("sealed page does not open") from exc
        result: bytearray | memoryview
        if out is None:
            result = bytearray(size)
            dst = memoryview(result)
        else:
            dst = _bytes_view(out)
            if dst.readonly or dst.nbytes < size:
                raise ValueError(f"out must be a writable buffer of at least {size} bytes")
            dst = result = dst[:size]
        try:
            aead.decrypt_into(nonce, src[HEADER_BYTES:], header + binding, dst)
        except InvalidSeal:
            dst[:] = bytes(size)  # never leave unauthenticated plaintext behind
            raise
        return result
