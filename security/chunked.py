"""Chunked sealing, record format version 2: a header that names nothing, chunks on all cores.

Layout (big endian; ``record_size(n)`` bytes, the same for every ``n`` of a size class)::

    preamble  64 B  magic "AKVC" | version 2 | flags | reserved u16 | key id 16 B |
                    epoch u64 | slot id 32 B
    meta     512 B  nonce 12 B | AES-GCM(n, chunk bytes, chunks, app length, app bytes,
                    zero fill to 484 B) | tag 16 B
    chunk i         nonce 12 B | AES-GCM(plaintext[i*chunk : (i+1)*chunk]) | tag 16 B
    zero padding    up to the size class of ``n``

Only the version, the key id (an opaque 16-byte tag of the tenant and key generation,
keyed with the tenant's blinding secret, plus the random data-key epoch) and the
caller's blinded slot identity are in the clear. The true length, the chunk geometry and
whatever the caller keeps about the record (``app`` bytes: page key, codec, shape...) are
inside the meta block; its length is fixed and the record is padded to a size class, so
the stored length tells only the class (four per power of two, at least 4 KiB).

Every chunk is its own AES-256-GCM message under the epoch's data key with a fresh random
nonce (the keyring counts one use per chunk and one for the meta block), and its AAD binds
the preamble, the meta block's nonce (unique to the record), tenant, page identity digest,
key generation, tier, location, the page's length and chunk count, and the chunk's index:
a chunk moved, dropped, repeated, or taken from another record (another page, slot or
tenant, or an earlier sealing of the same page) does not open. Chunks are sealed and
opened on a small thread pool (the AEAD calls release the GIL), straight into the caller's
buffers.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from security import _primitives as prim
from security._fan import Fan, default_threads
from security.errors import InvalidName, InvalidSeal, KeyUnavailable
from security.keyring import TenantKeyring, validate_generation, validate_namespace
from security.sealing import _bytes_view

VERSION = 2
MAGIC = b"AKVC"
_PRE = struct.Struct(">4sBBH16sQ32s")  # magic, version, flags, reserved, key id, epoch, slot id
PREAMBLE_BYTES = _PRE.size  # 64
KEY_ID_BYTES = 16
SLOT_ID_BYTES = 32
DIGEST_BYTES = 32
_META = struct.Struct(">QIIH")  # plaintext length, chunk bytes, chunks, app length
META_PLAIN_BYTES = 484
META_BYTES = prim.NONCE_BYTES + META_PLAIN_BYTES + prim.TAG_BYTES  # 512
MAX_APP_BYTES = META_PLAIN_BYTES - _META.size
HEAD_BYTES = PREAMBLE_BYTES + META_BYTES
CHUNK_OVERHEAD = prim.NONCE_BYTES + prim.TAG_BYTES
MIN_CLASS = 4096
MIN_CHUNK, MAX_CHUNK = 64 << 10, 4 << 20
PARALLEL_FROM = 512 << 10  # smaller pages are sealed on the calling thread alone
_BIND = struct.Struct(">QBQQI")  # generation, tier, location, plaintext length, chunks
_INDEX = struct.Struct(">I")
_KEY_ID_DOMAIN = b"agentkv/record-key-id/v1\0"
_BLIND_SUFFIX = ".blind.key"


def size_class(n: int) -> int:
    """The padded length of an ``n``-byte page: 4 KiB, then four classes per power of two."""
    if n < 0:
        raise ValueError("plaintext length cannot be negative")
    if n <= MIN_CLASS:
        return MIN_CLASS
    p = 1 << ((n - 1).bit_length() - 1)  # p < n <= 2p
    step = p // 4
    return p + step * -(-(n - p) // step)


def chunk_bytes(klass: int) -> int:
    """Chunk size of a size class: a quarter of it, 64 KiB to 4 MiB, 4 KiB multiple. Four
    chunks keep two cores busy and let a restore push one while it opens the next; eight
    cost measurably more Python per page at 2 MiB (0.75 vs 0.9 of raw AES-GCM, one core)."""
    return min(MAX_CHUNK, max(MIN_CHUNK, -(-(klass // 4) // 4096) * 4096))


def chunk_count(n: int, chunk: int) -> int:
    return max(1, -(-n // chunk))


def record_size(n: int) -> int:
    """Bytes of a sealed record of ``n`` plaintext bytes (a function of its size class)."""
    klass = size_class(n)
    return HEAD_BYTES + klass + chunk_count(klass, chunk_bytes(klass)) * CHUNK_OVERHEAD


def is_chunked(record: object) -> bool:
    """Whether ``record`` starts like a version-2 sealed record (nothing is verified)."""
    head = bytes(memoryview(record)[:5])  # type: ignore[arg-type]
    return head[:4] == MAGIC and head[4:5] == bytes((VERSION,))


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


def _flat(buf: object, writable: bool = False) -> memoryview:
    view = _bytes_view(buf)
    if writable and view.readonly:
        raise ValueError("out must be a writable buffer")
    return view


class ChunkedSealer:
    """Seals and opens version-2 records for every tenant of one keyring."""

    def __init__(self, keyring: TenantKeyring, threads: int | None = None) -> None:
        self.keyring = keyring
        self._fan = Fan(default_threads() if threads is None else threads)
        self._ids: dict[bytes, tuple[str, int]] = {}
        self._ids_lock = threading.Lock()
        # (tenant, generation) -> (the epoch it was last used with, key id): recomputed for
        # another epoch (a tenant created anew under the name seals under a new one). Only
        # the public key id is kept, never a key: an erased tenant leaves nothing here that
        # opens anything (a stale id only lets a record reach its tag check, which fails).
        self._own: dict[tuple[str, int], tuple[int, bytes]] = {}

    # -- key ids -----------------------------------------------------------------------------
    def key_id(self, tenant: str, generation: int) -> bytes:
        """16 opaque bytes naming (tenant, generation): keyed with the tenant's blinding
        secret, so they link records of one key and say nothing else (gone on erasure)."""
        try:
            secret = self.keyring.blind_secret(tenant)
        except KeyUnavailable:
            raise InvalidSeal("sealed record does not open") from None
        tag = hmac.new(secret, _KEY_ID_DOMAIN + generation.to_bytes(8, "big"), hashlib.sha256)
        return tag.digest()[:KEY_ID_BYTES]

    def _key_id_for(self, tenant: str, generation: int, epoch: int) -> bytes:
        cached = self._own.get((tenant, generation))
        if cached is not None and cached[0] == epoch:
            return cached[1]
        key_id = self.key_id(tenant, generation)
        self._own[(tenant, generation)] = (epoch, key_id)
        return key_id

    def _owner(self, key_id: bytes) -> tuple[str, int]:
        """(tenant, generation) of a key id, from the keyring's live keys."""
        with self._ids_lock:
            found = self._ids.get(key_id)
        if found is not None:
            return found
        table: dict[bytes, tuple[str, int]] = {}
        for name in self.keyring.source.names():
            if not name.endswith(_BLIND_SUFFIX):
                continue
            tenant = name[: -len(_BLIND_SUFFIX)]
            try:
                for gen in self.keyring.generations(tenant):
                    table[self.key_id(tenant, gen)] = (tenant, gen)
            except (InvalidName, InvalidSeal):
                continue
        with self._ids_lock:
            self._ids = table
        if key_id not in table:
            raise InvalidSeal("sealed record does not open")
        return table[key_id]

    # -- sealing ---------------------------------------------------------------------------
    def seal_into(self, out: object, plain: object, binding: Binding, app: bytes = b"") -> int:
        """Seal ``plain`` into the start of ``out`` (``record_size(n)`` bytes or more);
        returns the record's size. ``app`` (up to ``MAX_APP_BYTES``) is sealed in the meta
        block and comes back from ``read_meta``."""
        src = _flat(plain)
        n = src.nbytes
        if len(app) > MAX_APP_BYTES:
            raise ValueError(f"app metadata is {len(app)} B; at most {MAX_APP_BYTES}")
        size = record_size(n)
        dst = _flat(out, writable=True)
        if dst.nbytes < size:
            raise ValueError(f"out must be a writable buffer of at least {size} bytes")
        chunk = chunk_bytes(size_class(n))
        count = chunk_count(n, chunk)
        epoch, aead = self.keyring.seal_key(binding.tenant, binding.generation, count + 1)
        pre = _PRE.pack(MAGIC, VERSION, 0, 0,
                        self._key_id_for(binding.tenant, binding.generation, epoch), epoch,
                        bytes(binding.slot_id))
        dst[:PREAMBLE_BYTES] = pre
        nonces = prim.random_bytes(prim.NONCE_BYTES * (count + 1))
        meta = bytearray(META_PLAIN_BYTES)
        _META.pack_into(meta, 0, n, chunk, count, len(app))
        meta[_META.size:_META.size + len(app)] = app
        at = PREAMBLE_BYTES
        dst[at:at + prim.NONCE_BYTES] = nonces[:prim.NONCE_BYTES]
        aead.encrypt_into(nonces[:prim.NONCE_BYTES], meta, _meta_aad(pre, binding.tier),
                          dst[at + prim.NONCE_BYTES:HEAD_BYTES])
        prefix = _chunk_aad_prefix(pre, nonces[:prim.NONCE_BYTES], binding, n, count)

        def seal_one(i: int) -> None:
            off = HEAD_BYTES + i * (chunk + CHUNK_OVERHEAD)
            length = min(chunk, n - i * chunk)
            nonce = nonces[(i + 1) * prim.NONCE_BYTES:(i + 2) * prim.NONCE_BYTES]
            dst[off:off + prim.NONCE_BYTES] = nonce
            aead.encrypt_into(nonce, src[i * chunk:i * chunk + length],
                              prefix + _INDEX.pack(i),
                              dst[off + prim.NONCE_BYTES:off + CHUNK_OVERHEAD + length])

        self._fan.run(count, seal_one, n >= PARALLEL_FROM)
        used = HEAD_BYTES + n + count * CHUNK_OVERHEAD
        if used < size:  # padding: zeros, so a slot's old bytes never ride along
            np.frombuffer(dst, np.uint8, size - used, used).fill(0)
        return size

    # -- opening ---------------------------------------------------------------------------
    def read_meta(self, record: object, tier: int, tenant: str | None = None,
                  generation: int | None = None) -> SealedMeta:
        """Open a record's meta block. With no ``tenant``, the key id is looked up among
        the keyring's live keys (a restarted store rebuilding its index). Raises
        ``InvalidSeal`` for anything that is not an intact record under a live key."""
        src = _flat(record)
        if src.nbytes < HEAD_BYTES:
            raise InvalidSeal("sealed record does not open")
        pre = bytes(src[:PREAMBLE_BYTES])
        magic, version, flags, reserved, key_id, epoch, slot_id = _PRE.unpack(pre)
        if magic != MAGIC or version != VERSION or flags or reserved:
            raise InvalidSeal("sealed record does not open")
        if tenant is None or generation is None:
            tenant, generation = self._owner(key_id)
        try:
            aead = self.keyring.open_key(tenant, generation, epoch)
        except KeyUnavailable as exc:
            raise InvalidSeal("sealed record does not open") from exc
        if not hmac.compare_digest(key_id, self._key_id_for(tenant, generation, epoch)):
            raise InvalidSeal("sealed record does not open")
        at = PREAMBLE_BYTES
        meta = bytearray(META_PLAIN_BYTES)
        aead.decrypt_into(bytes(src[at:at + prim.NONCE_BYTES]),
                          src[at + prim.NONCE_BYTES:HEAD_BYTES], _meta_aad(pre, tier), meta)
        n, chunk, count, app_len = _META.unpack_from(meta)
        if (chunk == 0 or count != chunk_count(n, chunk) or app_len > MAX_APP_BYTES
                or src.nbytes < HEAD_BYTES + n + count * CHUNK_OVERHEAD):
            raise InvalidSeal("sealed record does not open")  # truncated: a chunk is missing
        return SealedMeta(tenant=tenant, generation=generation, epoch=epoch, slot_id=slot_id,
                          nbytes=n, chunk=chunk, chunks=count,
                          app=bytes(meta[_META.size:_META.size + app_len]))

    def opener(self, record: object, meta: SealedMeta, binding: Binding
               ) -> Callable[[int, object], bool]:
        """``open_chunk(i, out)``: opens chunk ``i`` of ``record`` into ``out`` (its plaintext
        length); False (and ``out`` zeroed) when it does not open. For pipelines that hand
        each chunk on as soon as it opened; ``open_into`` opens them all."""
        src = _flat(record)
        if (binding.tenant, binding.generation) != (meta.tenant, meta.generation) or \
                not hmac.compare_digest(bytes(binding.slot_id), meta.slot_id):
            return lambda i, out: False
        try:
            aead = self.keyring.open_key(meta.tenant, meta.generation, meta.epoch)
        except KeyUnavailable:  # erased since the meta block opened
            return lambda i, out: False
        pre = bytes(src[:PREAMBLE_BYTES])
        record_nonce = bytes(src[PREAMBLE_BYTES:PREAMBLE_BYTES + prim.NONCE_BYTES])
        prefix = _chunk_aad_prefix(pre, record_nonce, binding, meta.nbytes, meta.chunks)

        def open_chunk(i: int, out: object) -> bool:
            off = meta.chunk_offset(i)
            length = min(meta.chunk, meta.nbytes - i * meta.chunk)
            dst = _flat(out, writable=True)[:length]
            try:
                aead.decrypt_into(bytes(src[off:off + prim.NONCE_BYTES]),
                                  src[off + prim.NONCE_BYTES:off + CHUNK_OVERHEAD + length],
                                  prefix + _INDEX.pack(i), dst)
            except InvalidSeal:
                dst[:] = bytes(length)  # never leave unauthenticated plaintext behind
                return False
            return True

        return open_chunk

    def open_into(self, record: object, binding: Binding, out: object = None,
                  meta: SealedMeta | None = None) -> memoryview:
        """Open a whole record into ``out`` (or a new buffer); returns a view of its
        plaintext. Raises ``InvalidSeal`` (``out`` zeroed) if any part fails to open."""
        if meta is None:
            meta = self.read_meta(record, binding.tier, binding.tenant, binding.generation)
        n = meta.nbytes
        dst = memoryview(bytearray(n)) if out is None else _flat(out, writable=True)
        if dst.nbytes < n:
            raise ValueError(f"out must be a writable buffer of at least {n} bytes")
        open_chunk = self.opener(record, meta, binding)
        failed: list[int] = []

        def one(i: int) -> None:
            start = i * meta.chunk
            if not open_chunk(i, dst[start:start + min(meta.chunk, n - start)]):
                failed.append(i)

        self._fan.run(meta.chunks, one, n >= PARALLEL_FROM)
        if failed:
            np.frombuffer(dst, np.uint8, n).fill(0)
            raise InvalidSeal("sealed record does not open")
        return dst[:n]


def _meta_aad(pre: bytes, tier: int) -> bytes:
    return pre + b"meta" + bytes((tier,))


def _chunk_aad_prefix(pre: bytes, record_nonce: bytes, b: Binding, n: int, count: int) -> bytes:
    """The AAD every chunk shares; the meta block's random nonce makes it unique to this
    record, so chunks of two sealings under one binding never mix."""
    name = b.tenant.encode()
    return (pre + record_nonce + b"data" + bytes((len(name),)) + name + bytes(b.digest)
            + _BIND.pack(b.generation, b.tier, b.location, n, count))
