"""The page format: a fixed versioned header and a payload (usually ``EncodedKV.to_bytes()``).

Layout (little endian), ``HEADER_SIZE`` bytes, then ``payload_len`` payload bytes::

    magic "AKVP" | format_version u16 | header_size u16 | codec u8 | dtype u8 |
    k_ndim u8 | v_ndim u8 | k_shape 4*u32 | v_shape 4*u32 | token_start u64 |
    token_end u64 | generation u64 | payload_len u64 | identity_digest 32s |
    checksum u32 (CRC-32 of every header byte before it, then the payload)

Torch-free on purpose: directory, NVMe and pool code parse headers without it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from store.types import KV_DTYPE_NAMES, Codec

if TYPE_CHECKING:
    from store.codecs import EncodedKV

MAGIC = b"AKVP"
FORMAT_VERSION = 1
MAX_PAYLOAD = 1 << 30  # 1 GiB: anything larger is a corrupt length, not a page
_BODY = struct.Struct("<4sHHBBBB4I4IQQQQ32s")
_CRC = struct.Struct("<I")
HEADER_SIZE = _BODY.size + _CRC.size


class PageFormatError(ValueError):
    """Base class: the bytes are not a valid page."""


class Truncated(PageFormatError):
    """Fewer bytes than the header, or than header + payload_len."""


class Oversized(PageFormatError):
    """More bytes than header + payload_len, or a payload_len beyond the limit."""


class WrongVersion(PageFormatError):
    """A format version (or header size) this code does not read."""


class BadChecksum(PageFormatError):
    """The CRC-32 over header and payload does not match."""


class BadMagic(PageFormatError):
    """The bytes do not start with the page magic."""


@dataclass(frozen=True, kw_only=True)
class PageHeader:
    """Everything about a page except its payload bytes."""

    format_version: int
    identity_digest: bytes
    codec: Codec
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    dtype: str
    token_start: int
    token_end: int
    generation: int
    payload_len: int
    checksum: int

    @property
    def page_len(self) -> int:
        return HEADER_SIZE + self.payload_len


def _dims(shape: tuple[int, ...], name: str) -> list[int]:
    if len(shape) > 4 or any(not 0 <= int(d) < 1 << 32 for d in shape):
        raise ValueError(f"{name} {shape} must have at most 4 dims in [0, 2**32)")
    return [int(d) for d in shape] + [0] * (4 - len(shape))


def pack_header(
    *,
    identity_digest: bytes,
    codec: Codec,
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    dtype: str,
    token_start: int,
    token_end: int,
    generation: int,
    payload: bytes | bytearray | memoryview,
) -> bytes:
    """The HEADER_SIZE bytes that precede ``payload`` (checksum covers both)."""
    if len(identity_digest) != 32:
        raise ValueError(f"identity_digest must be 32 bytes, got {len(identity_digest)}")
    if dtype not in KV_DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {KV_DTYPE_NAMES}, got {dtype!r}")
    if not 0 <= token_start <= token_end:
        raise ValueError(f"bad token range [{token_start}, {token_end})")
    if generation < 0:
        raise ValueError(f"generation must be >= 0, got {generation}")
    payload_len = memoryview(payload).nbytes
    if payload_len > MAX_PAYLOAD:
        raise Oversized(f"payload of {payload_len} bytes exceeds {MAX_PAYLOAD}")
    body = _BODY.pack(
        MAGIC,
        FORMAT_VERSION,
        HEADER_SIZE,
        int(Codec(codec)),
        KV_DTYPE_NAMES.index(dtype),
        len(k_shape),
        len(v_shape),
        *_dims(k_shape, "k_shape"),
        *_dims(v_shape, "v_shape"),
        token_start,
        token_end,
        generation,
        payload_len,
        bytes(identity_digest),
    )
    return body + _CRC.pack(zlib.crc32(payload, zlib.crc32(body)))


def pack_page(*, payload: bytes | bytearray | memoryview, **fields) -> bytes:
    """Header + payload as one bytes object. ``fields`` are :func:`pack_header`'s."""
    return pack_header(payload=payload, **fields) + bytes(payload)


def pack_encoded(
    enc: EncodedKV, *, identity_digest: bytes, token_start: int, token_end: int, generation: int
) -> bytes:
    """A page whose payload is ``enc.to_bytes()``; codec, shapes and dtype come from ``enc``."""
    payload = enc.to_bytes()
    return pack_page(
        payload=payload,
        identity_digest=identity_digest,
        codec=enc.spec.codec,
        k_shape=enc.k_shape,
        v_shape=enc.v_shape,
        dtype=str(enc.dtype).removeprefix("torch."),
        token_start=token_start,
        token_end=token_end,
        generation=generation,
    )


def parse_header(buf: bytes | bytearray | memoryview) -> PageHeader:
    """Parse and validate the header only (no checksum check: that needs the payload)."""
    view = memoryview(buf).cast("B")
    if len(view) < HEADER_SIZE:
        raise Truncated(f"page header needs {HEADER_SIZE} bytes, got {len(view)}")
    fields = _BODY.unpack_from(view)
    magic, version, header_size, codec, dtype, k_nd, v_nd = fields[:7]
    if magic != MAGIC:
        raise BadMagic(f"bad page magic {magic!r}")
    if version != FORMAT_VERSION or header_size != HEADER_SIZE:
        raise WrongVersion(
            f"page format {version} (header {header_size} B); this reads "
            f"{FORMAT_VERSION} ({HEADER_SIZE} B)"
        )
    token_start, token_end, generation, payload_len, digest = fields[15:20]
    if payload_len > MAX_PAYLOAD:
        raise Oversized(f"payload_len {payload_len} exceeds {MAX_PAYLOAD}")
    try:
        codec_enum = Codec(codec)
        dtype_name = KV_DTYPE_NAMES[dtype]
    except (ValueError, IndexError) as exc:
        raise BadChecksum(f"header fields out of range ({exc}); header is corrupt") from exc
    if k_nd > 4 or v_nd > 4:
        raise BadChecksum(f"shape ranks {k_nd}/{v_nd} out of range; header is corrupt")
    return PageHeader(
        format_version=version,
        identity_digest=digest,
        codec=codec_enum,
        k_shape=tuple(fields[7 : 7 + k_nd]),
        v_shape=tuple(fields[11 : 11 + v_nd]),
        dtype=dtype_name,
        token_start=token_start,
        token_end=token_end,
        generation=generation,
        payload_len=payload_len,
        checksum=_CRC.unpack_from(view, _BODY.size)[0],
    )


def parse_page(buf: bytes | bytearray | memoryview) -> tuple[PageHeader, memoryview]:
    """Validate a whole page; returns its header and a zero-copy view of the payload.

    Raises Truncated, Oversized, WrongVersion, BadChecksum or BadMagic.
    """
    view = memoryview(buf).cast("B")
    header = parse_header(view)
    if len(view) < header.page_len:
        raise Truncated(f"page needs {header.page_len} bytes, got {len(view)}")
    if len(view) > header.page_len:
        raise Oversized(f"page is {header.page_len} bytes, buffer holds {len(view)}")
    payload = view[HEADER_SIZE:]
    crc = zlib.crc32(payload, zlib.crc32(view[: _BODY.size]))
    if crc != header.checksum:
        raise BadChecksum(f"page checksum {crc:#010x} != stored {header.checksum:#010x}")
    return header, payload
