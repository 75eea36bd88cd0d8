"""What a format-2 record authenticates: where the page lives (``Binding``), what its meta
block says (``SealedMeta``), and the additional authenticated data of the meta block and
of every chunk. ``security.chunked`` seals and opens records with them; the bytes here are
pinned by the golden-digest and tamper tests."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from security.errors import InvalidName
from security.keyring import validate_generation, validate_namespace
from security.record_layout import (
    CHUNK_OVERHEAD,
    DIGEST_BYTES,
    HEAD_BYTES,
    META,
    META_PLAIN_BYTES,
    SLOT_ID_BYTES,
    Layout,
)

_BIND = struct.Struct(">QBQQI")  # generation, tier, location, plaintext length, chunks


class SealedMeta(NamedTuple):
    """What the meta block of a record says, once it opened. (A NamedTuple: one is built
    per open, and a frozen dataclass costs a few microseconds more to build.)"""

    tenant: str
    generation: int
    epoch: int
    slot_id: bytes
    nbytes: int
    chunk: int
    chunks: int
    app: bytes

    def parts(self) -> list[tuple[int, int]]:
        """(plaintext offset, length) of every chunk."""
        return [(i * self.chunk, min(self.chunk, self.nbytes - i * self.chunk))
                for i in range(self.chunks)]

    def chunk_offset(self, index: int) -> int:
        """Where chunk ``index`` (its nonce) starts in the record."""
        return HEAD_BYTES + index * (self.chunk + CHUNK_OVERHEAD)


@dataclass(frozen=True, kw_only=True)
class Binding:
    """Where a page lives, as its chunks' AAD binds it."""

    tenant: str
    generation: int
    tier: int
    slot_id: bytes  # blinded slot identity (in the clear in the preamble)
    digest: bytes  # page identity digest (never stored)
    location: int = 0  # a location id the caller keeps beside the record

    def __post_init__(self) -> None:
        validate_namespace(self.tenant)
        validate_generation(self.generation)
        if not 0 <= self.tier <= 255 or not 0 <= self.location < 2**64:
            raise InvalidName("tier must be in 0..255 and location in 0..2**64-1")
        for name, value, size in (("slot id", self.slot_id, SLOT_ID_BYTES),
                                  ("page identity digest", self.digest, DIGEST_BYTES)):
            if not isinstance(value, (bytes, bytearray)) or len(value) != size:
                raise InvalidName(f"{name} must be {size} bytes")


def meta_plain(lay: Layout, app: bytes) -> bytes:
    return (META.pack(lay.nbytes, lay.chunk, lay.count, len(app)) + app).ljust(
        META_PLAIN_BYTES, b"\0")


def tenant_part(tenant: str) -> bytes:
    """The tenant's part of the chunk AAD (cached per tenant by ``_own_for``)."""
    name = tenant.encode()
    return b"data" + bytes((len(name),)) + name


def chunk_aad(pre_nonce: bytes, tenant_part: bytes, b: Binding, n: int, count: int) -> bytes:
    """The AAD every chunk of a record shares (each chunk appends its index): the
    preamble and the meta block's random nonce (``pre_nonce``, which makes it unique to
    this record, so chunks of two sealings under one binding never mix), the tenant, the
    page digest, and generation, tier, location, length and chunk count."""
    return (pre_nonce + tenant_part + bytes(b.digest)
            + _BIND.pack(b.generation, b.tier, b.location, n, count))


def meta_aad(pre: bytes, tier: int) -> bytes:
    """The meta block's AAD: the preamble, ``b"meta"`` and the tier byte."""
    return pre + b"meta" + bytes((tier,))
