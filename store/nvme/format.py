"""On-disk record format of NVMe shard segments, and the recovery scan.

A record starts on an ``align`` boundary: a fixed header, the key, zero padding
up to the next boundary, then the payload (so payload reads land page-aligned
in the file and in the reader's buffer). The header carries a hash of the
payload and one of itself plus the key; a record counts only when both match
and its payload lies wholly inside the file, so a torn append is never seen.

The payload hash is XXH3-64 (RocksDB's default block checksum; ~65 GB/s here,
CRC-32C ~25 GB/s). Version 2 hashes a payload of more than one stripe (1 MiB)
stripe by stripe and stores the XXH3-64 of the stripes' hashes, so a reader
can verify stripes on two cores at once (``payload_digest``); version 1
records (one XXH3-64 over the whole payload) are still read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

MAGIC = b"AKVR"
FORMAT_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})
STRIPE_BYTES = 1 << 20  # version 2: payloads longer than this are hashed per stripe
FLAG_TOMBSTONE = 1
MAX_KEY_BYTES = 255
# magic, version, flags, key_len, reserved, generation, payload_len, seq, payload_hash, header_hash
HEADER = struct.Struct("<4sHHHHQQQQQ")
_HASH_AT = HEADER.size - 8
_HASH = struct.Struct("<Q")


class RecordFormatError(ValueError):
    """A header failed validation (bad magic, version, hash or lengths)."""


@dataclass(frozen=True, slots=True)
class RecordHeader:
    flags: int
    key: bytes
    generation: int
    payload_len: int
    seq: int
    payload_hash: int
    version: int = FORMAT_VERSION

    @property
    def is_tombstone(self) -> bool:
        return bool(self.flags & FLAG_TOMBSTONE)


# XXH3-64 of a buffer, as a 64-bit unsigned int (bound directly: it runs on every put and get).
checksum = xxhash.xxh3_64_intdigest


def combine(stripe_digests: list[int]) -> int:
    """Version 2 digest of a multi-stripe payload: XXH3-64 of its stripe hashes (LE u64s)."""
    return checksum(struct.pack(f"<{len(stripe_digests)}Q", *stripe_digests))


def payload_digest(data: memoryview | bytes, version: int = FORMAT_VERSION) -> int:
    """The payload hash a record of ``version`` stores."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if version == 1 or view.nbytes <= STRIPE_BYTES:
        return checksum(view)
    return combine(
        [checksum(view[i : i + STRIPE_BYTES]) for i in range(0, view.nbytes, STRIPE_BYTES)]
    )


def round_up(n: int, align: int) -> int:
    return (n + align - 1) & ~(align - 1)


def header_block(key_len: int, align: int) -> int:
    """Bytes from a record's start to its payload."""
    return round_up(HEADER.size + key_len, align)


def pack_header_into(buf: memoryview, header: RecordHeader) -> None:
    """Write header + key at the start of ``buf`` (which the caller zeroed up to the block)."""
    pack_fields_into(
        buf,
        header.flags,
        header.key,
        header.generation,
        header.payload_len,
        header.seq,
        header.payload_hash,
        header.version,
    )


def pack_fields_into(
    buf: memoryview,
    flags: int,
    key: bytes,
    generation: int,
    payload_len: int,
    seq: int,
    payload_hash: int,
    version: int = FORMAT_VERSION,
) -> None:
    """``pack_header_into`` from the fields: the append path builds no ``RecordHeader``."""
    key_len = len(key)
    end = HEADER.size + key_len
    HEADER.pack_into(
        buf, 0, MAGIC, version, flags, key_len, 0, generation, payload_len, seq, payload_hash, 0
    )
    buf[HEADER.size : end] = key
    _HASH.pack_into(buf, _HASH_AT, checksum(buf[:end]))


def parse_header(raw: bytes) -> RecordHeader:
    """Parse a header + key from ``raw`` (which may hold more bytes after them)."""
    if len(raw) < HEADER.size:
        raise RecordFormatError("truncated header")
    magic, version, flags, key_len, _r, gen, plen, seq, phash, hhash = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise RecordFormatError("bad magic")
    if version not in READABLE_VERSIONS:
        raise RecordFormatError(f"unknown record version {version}")
    if not 0 < key_len <= MAX_KEY_BYTES or len(raw) < HEADER.size + key_len:
        raise RecordFormatError("bad or truncated key")
    body = bytearray(raw[: HEADER.size + key_len])
    body[_HASH_AT : _HASH_AT + 8] = bytes(8)
    if checksum(body) != hhash:
        raise RecordFormatError("header checksum mismatch")
    key = bytes(raw[HEADER.size : HEADER.size + key_len])
    return RecordHeader(
        flags=flags,
        key=key,
        generation=gen,
        payload_len=plen,
        seq=seq,
        payload_hash=phash,
        version=version,
    )


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    header: RecordHeader
    offset: int  # record start
    payload_offset: int

    @property
    def end(self) -> int:
        return self.payload_offset + self.header.payload_len


def scan_segment(fd: int, size: int, align: int) -> Iterator[ScannedRecord]:
    """Every complete record with a valid header, in file order.

    After a bad header the scan resynchronises on the next ``align`` boundary, so
    one damaged record (a bit flip) does not hide the ones behind it. A valid header
    whose payload runs past the end of the file ends the scan: that is a torn append
    (a writer killed mid-put), and everything after its header is that record's own
    payload, which may carry any bytes, the image of a whole record for another key
    included. Resynchronising inside it would adopt such a forged record.
    """
    offset = 0
    while offset + HEADER.size <= size:
        raw = os.pread(fd, HEADER.size + MAX_KEY_BYTES, offset)
        try:
            header = parse_header(raw)
        except RecordFormatError:
            offset += align
            continue
        payload_offset = offset + header_block(len(header.key), align)
        if payload_offset + header.payload_len > size:  # torn tail: nothing after is a record
            return
        yield ScannedRecord(header=header, offset=offset, payload_offset=payload_offset)
        offset = round_up(payload_offset + header.payload_len, align)
