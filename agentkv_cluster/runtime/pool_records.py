"""The pool actor's stored-record format: a plaintext header, then the page sealed in chunks.

``record = magic ‖ header length ‖ msgpack header ‖ sealed chunk 0 ‖ sealed chunk 1 ‖ ...``.
The header names the page (key, namespace, codec, location id; no tenant data) so a
restarted actor rebuilds its index from the records alone. Each chunk is its own
AES-GCM message bound to the location id, its index and a last-chunk flag.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from security.sealing import TenantSealer, sealed_size
from store.types import Codec, Tier

_REC = struct.Struct(">4sI")  # magic, header length
_MAGIC = b"AKVR"
# Pages are sealed in 2 MiB chunks, so a restore pushes the chunks it has opened by NIXL
# while it opens the next ones.
CHUNK = 2 << 20


@dataclass(slots=True)
class StoredCopy:
    tier: Tier
    slot: int  # host pool slot; -1 on NVMe
    loc: int  # location id bound into the seal
    seal_gen: int
    dir_gen: int
    nbytes: int  # plaintext (encoded) bytes
    namespace: str
    full: int = 0  # full-precision page bytes
    state_type: str = "temp_reasoning"
    shape: list | None = None  # [layers, kv_heads, tokens, head_dim, dtype]


def sealed_total(n: int, chunk: int = CHUNK) -> int:
    chunks = max(1, -(-n // chunk))
    return n + chunks * (sealed_size(0))


def chunk_slot(loc: int, index: int, last: bool) -> int:
    """The seal binding of one chunk: its index, and a flag on the final chunk so a record
    cut short (an edited length in the plaintext header) fails to open."""
    return loc * 4096 + (2048 if last else 0) + index


def chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of an n-byte page; chunk 0 = whole page."""
    if chunk <= 0:
        return [(0, n)]
    return [(off, min(chunk, n - off)) for off in range(0, max(n, 1), chunk)]


def nvme_key(key: bytes, codec: Codec) -> bytes:
    return key + bytes((int(codec),))


def header_of(key: bytes, codec: Codec, copy: StoredCopy) -> bytes:
    return msgpack.packb({"k": key, "ns": copy.namespace, "c": int(codec), "loc": copy.loc,
                          "sg": copy.seal_gen, "dg": copy.dir_gen, "n": copy.nbytes, "ch": CHUNK,
                          "fl": copy.full, "st": copy.state_type, "sh": copy.shape})


def copy_of(h: dict[str, Any], tier: Tier, slot: int) -> StoredCopy:
    """The index entry a record's header describes."""
    return StoredCopy(tier=tier, slot=slot, loc=h["loc"], seal_gen=h["sg"], dir_gen=h["dg"],
                      nbytes=h["n"], namespace=h["ns"], full=h.get("fl", h["n"]),
                      state_type=h.get("st", "temp_reasoning"), shape=h.get("sh"))


def build_record(sealer: TenantSealer, header: bytes, copy: StoredCopy, digest: bytes,
                 plain: Any) -> bytearray:
    """Seal ``plain`` chunk by chunk behind ``header``, bound to ``copy``'s tier and location."""
    record = bytearray(_REC.size + len(header) + sealed_total(len(plain)))
    _REC.pack_into(record, 0, _MAGIC, len(header))
    record[_REC.size:_REC.size + len(header)] = header
    out, src = _REC.size + len(header), memoryview(plain)
    parts = chunks(len(plain), CHUNK)
    for i, (off, n) in enumerate(parts):
        sealer.seal(copy.namespace, digest, copy.seal_gen, int(copy.tier),
                    chunk_slot(copy.loc, i, i == len(parts) - 1), src[off:off + n],
                    out=memoryview(record)[out:out + sealed_size(n)])
        out += sealed_size(n)
    return record


def parse(record: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """(header, sealed chunks) of a record; ValueError if it is not one."""
    view = memoryview(record)
    if len(view) < _REC.size:
        raise ValueError("record too short")
    magic, hlen = _REC.unpack_from(view)
    if magic != _MAGIC or _REC.size + hlen > len(view):
        raise ValueError("not a pool record")
    header = msgpack.unpackb(bytes(view[_REC.size:_REC.size + hlen]), raw=False)
    if not isinstance(header, dict):
        raise ValueError("record header is not a map")  # noqa: TRY004 - bad data
    return header, view[_REC.size + hlen:]
