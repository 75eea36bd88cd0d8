"""Record format 2: its constants and geometry (size classes, chunk sizes, where each
part of a record lies). Pure arithmetic; ``security.chunked`` seals and opens records.

Layout (big endian; ``record_size(n)`` bytes, the same for every ``n`` of a size class)::

    preamble  64 B  magic "AKVC" | version 2 | flags | reserved u16 | key id 16 B |
                    epoch u64 | slot id 32 B
    meta     512 B  nonce 12 B | AES-GCM(n, chunk bytes, chunks, app length, app bytes,
                    zero fill to 484 B) | tag 16 B
    chunk i         nonce 12 B | AES-GCM(plaintext[i*chunk : (i+1)*chunk]) | tag 16 B
    noise padding   up to the size class of ``n`` (CSPRNG or AES-CTR keystream under a
                    fresh key: indistinguishable from the chunks, so the end does not show)
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

from security import _primitives as prim

VERSION = 2
MAGIC = b"AKVC"
PRE = struct.Struct(">4sBBH16sQ32s")  # magic, version, flags, reserved, key id, epoch, slot id
PREAMBLE_BYTES = PRE.size  # 64
KEY_ID_BYTES = 16
SLOT_ID_BYTES = 32
DIGEST_BYTES = 32
META = struct.Struct(">QIIH")  # plaintext length, chunk bytes, chunks, app length
META_PLAIN_BYTES = 484
META_BYTES = prim.NONCE_BYTES + META_PLAIN_BYTES + prim.TAG_BYTES  # 512
MAX_APP_BYTES = META_PLAIN_BYTES - META.size
HEAD_BYTES = PREAMBLE_BYTES + META_BYTES
NONCE_END = PREAMBLE_BYTES + prim.NONCE_BYTES  # the meta block's nonce ends here
CHUNK_OVERHEAD = prim.NONCE_BYTES + prim.TAG_BYTES
MIN_CLASS = 4096
MIN_CHUNK, MAX_CHUNK = 64 << 10, 4 << 20
INDEX = struct.Struct(">I")


def size_class(n: int) -> int:
    """The padded length of an ``n``-byte page: 4 KiB, then four classes per power of two."""
    if n < 0:
        raise ValueError("plaintext length cannot be negative")
    if n <= MIN_CLASS:
        return MIN_CLASS
    p = 1 << ((n - 1).bit_length() - 1)  # p < n <= 2p
    step = p // 4
    return p + step * -(-(n - p) // step)


def chunk_bytes(klass: int, one_thread: bool = False) -> int:
    """Chunk size of a size class: a quarter of it, 64 KiB to 4 MiB, 4 KiB multiple. Four
    chunks keep two cores busy and let a restore push one while it opens the next; eight
    cost measurably more Python per page at 2 MiB (0.75 vs 0.9 of raw AES-GCM, one core).
    A sealer on one thread (``one_thread``) has no second core to keep busy: it uses the
    largest chunk, ``MAX_CHUNK``; the meta block names the chunk size, so every reader
    opens records of either geometry, and the record's size (its class) is the same."""
    if one_thread:
        return MAX_CHUNK
    return min(MAX_CHUNK, max(MIN_CHUNK, -(-(klass // 4) // 4096) * 4096))


def chunk_count(n: int, chunk: int) -> int:
    return max(1, -(-n // chunk))


def record_size(n: int) -> int:
    """Bytes of a sealed record of ``n`` plaintext bytes (a function of its size class)."""
    klass = size_class(n)
    return HEAD_BYTES + klass + chunk_count(klass, chunk_bytes(klass)) * CHUNK_OVERHEAD


class Layout(NamedTuple):
    """Where everything of an ``n``-byte page goes in its record (sealing, computed once per
    page size and geometry): the record's size, chunk geometry, the end of the sealed bytes
    (noise padding after it), per chunk (plaintext start, plaintext end, record offset of its
    nonce, record end of its ciphertext and tag, nonce offset in the record's nonce draw,
    AAD index bytes), the page length, the meta block's plaintext with no app bytes and the
    bytes of nonces it takes."""

    size: int
    chunk: int
    count: int
    used: int
    parts: tuple[tuple[int, int, int, int, int, bytes], ...]
    nbytes: int
    meta: bytes
    nonces: int  # bytes of nonces a record takes: one per chunk and one for the meta block


@functools.lru_cache(maxsize=4096)
def layout(n: int, one_thread: bool = False) -> Layout:
    """The layout of an ``n``-byte page (``one_thread``: as a one-thread sealer cuts it)."""
    chunk = chunk_bytes(size_class(n), one_thread)
    count = chunk_count(n, chunk)
    return Layout(size=record_size(n), chunk=chunk, count=count,
                  used=HEAD_BYTES + n + count * CHUNK_OVERHEAD, parts=parts(n, chunk, count),
                  nbytes=n, meta=META.pack(n, chunk, count, 0).ljust(META_PLAIN_BYTES, b"\0"),
                  nonces=(count + 1) * prim.NONCE_BYTES)


@functools.lru_cache(maxsize=4096)
def parts(n: int, chunk: int, count: int) -> tuple[tuple[int, int, int, int, int, bytes], ...]:
    """Per chunk of an ``n``-byte page cut into ``count`` chunks of ``chunk`` bytes (as its
    meta block says when opening): see ``Layout.parts``."""
    parts = []
    for i in range(count):
        start, off = i * chunk, HEAD_BYTES + i * (chunk + CHUNK_OVERHEAD)
        length = min(chunk, n - start)
        parts.append((start, start + length, off, off + CHUNK_OVERHEAD + length,
                      (i + 1) * prim.NONCE_BYTES, INDEX.pack(i)))
    return tuple(parts)


def is_chunked(record: object) -> bool:
    """Whether ``record`` starts like a version-2 sealed record (nothing is verified)."""
    head = bytes(memoryview(record)[:5])  # type: ignore[arg-type]
    return head[:4] == MAGIC and head[4:5] == bytes((VERSION,))
