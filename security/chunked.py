"""Chunked sealing, record format version 2: a header that names nothing, chunks on all cores.

The layout of a record (preamble, sealed meta block, chunks, padding to a size class) and
its geometry are in ``security.record_layout``, what its AAD binds (``Binding``, the meta
and chunk AAD) in ``security.record_binding``; the public names are re-exported here.

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
buffers. A sealer with no helper thread seals in chunks of ``MAX_CHUNK`` (one chunk up to
4 MiB): with no second core to feed, each further chunk only costs an AEAD call; the meta
block names the chunk size, so every reader opens either geometry. The per-record work
around the AES calls is kept small: after each multi-MiB page it runs with cold caches,
where every Python step costs microseconds.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import struct
import threading
from collections.abc import Callable

import numpy as np

from security import _primitives as prim
from security._fan import Fan, default_threads
from security.errors import InvalidName, InvalidSeal, KeyUnavailable
from security.keyring import TenantKeyring
from security.record_binding import (  # what a record's AAD binds (re-exported here)
    Binding,
    SealedMeta,
    chunk_aad,
    meta_aad,
    meta_plain,
    tenant_part,
)
from security.record_layout import (  # the format's geometry (re-exported here)
    CHUNK_OVERHEAD,
    DIGEST_BYTES,
    HEAD_BYTES,
    KEY_ID_BYTES,
    MAGIC,
    MAX_APP_BYTES,
    MAX_CHUNK,
    META_BYTES,
    META_PLAIN_BYTES,
    MIN_CHUNK,
    MIN_CLASS,
    NONCE_END,
    PREAMBLE_BYTES,
    SLOT_ID_BYTES,
    VERSION,
    chunk_bytes,
    chunk_count,
    is_chunked,
    layout,
    parts,
    record_size,
    size_class,
)
from security.record_layout import INDEX as _INDEX
from security.record_layout import META as _META
from security.record_layout import PRE as _PRE
from security.sealing import _bytes_view

__all__ = [
    "CHUNK_OVERHEAD", "DIGEST_BYTES", "HEAD_BYTES", "KEY_ID_BYTES", "MAGIC", "MAX_APP_BYTES",
    "MAX_CHUNK", "META_BYTES", "META_PLAIN_BYTES", "MIN_CHUNK", "MIN_CLASS", "PARALLEL_FROM",
    "PREAMBLE_BYTES", "SLOT_ID_BYTES", "VERSION", "Binding", "ChunkedSealer", "SealedMeta",
    "chunk_bytes", "chunk_count", "default_threads", "is_chunked", "record_size", "size_class",
]

PARALLEL_FROM = 512 << 10  # smaller pages are sealed on the calling thread alone
_NONCE = prim.NONCE_BYTES
_PRE_HEAD = struct.Struct(_PRE.format[:-3])  # the preamble up to the slot id
_FLAT = frozenset((bytes, bytearray, mmap.mmap))  # always one-dimensional unsigned bytes
_nonce_bytes = prim.nonce_bytes
_KEY_ID_DOMAIN = b"agentkv/record-key-id/v1\0"
_BLIND_SUFFIX = ".blind.key"


# A record's opened meta block, with the data key that opened it, its preamble and meta
# nonce, and the tenant's part of the chunk AAD: (tenant, generation, epoch, slot id,
# nbytes, chunk, chunks, app, aead, preamble and nonce, tenant part). A plain tuple: it is
# built on every open, where a NamedTuple's constructor costs a Python frame.
_Head = tuple[str, int, int, bytes, int, int, int, bytes, prim.Aead, bytes, bytes]


def _flat(buf: object, writable: bool = False) -> memoryview:
    view = memoryview(buf) if type(buf) in _FLAT else _bytes_view(buf)
    if writable and view.readonly:
        raise ValueError("out must be a writable buffer")
    return view


class ChunkedSealer:
    """Seals and opens version-2 records for every tenant of one keyring."""

    def __init__(self, keyring: TenantKeyring, threads: int | None = None) -> None:
        self.keyring = keyring
        self._fan = Fan(default_threads() if threads is None else threads)
        self._one_thread = self._fan.threads == 1  # seals in the largest chunks
        self._ids: dict[bytes, tuple[str, int]] = {}
        self._ids_lock = threading.Lock()
        # (tenant, generation) -> (the epoch it was last used with, key id, the preamble up
        # to the slot id, the tenant's part of the chunk AAD): recomputed for another epoch
        # (a tenant created anew under the name seals under a new one). Only public bytes
        # are kept, never a key: an erased tenant leaves nothing here that opens anything
        # (a stale id only lets a record reach its tag check, which fails).
        self._own: dict[tuple[str, int], tuple[int, bytes, bytes, bytes]] = {}

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
        return self._own_for(tenant, generation, epoch)[1]

    def _own_for(self, tenant: str, generation: int, epoch: int
                 ) -> tuple[int, bytes, bytes, bytes]:
        cached = self._own.get((tenant, generation))
        if cached is not None and cached[0] == epoch:
            return cached
        key_id = self.key_id(tenant, generation)
        cached = (epoch, key_id, _PRE_HEAD.pack(MAGIC, VERSION, 0, 0, key_id, epoch),
                  tenant_part(tenant))
        self._own[(tenant, generation)] = cached
        return cached

    def forget(self, tenant: str, generation: int | None = None) -> None:
        """Erasure: drop what names ``tenant`` (its ``generation``, or every one)."""
        def gone(owner: tuple[str, int]) -> bool:
            return owner[0] == tenant and generation in (None, owner[1])

        for owner in [o for o in list(self._own) if gone(o)]:
            self._own.pop(owner, None)
        with self._ids_lock:
            self._ids = {i: o for i, o in self._ids.items() if not gone(o)}

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
        src, dst = _flat(plain), _flat(out, writable=True)
        n = src.nbytes
        if len(app) > MAX_APP_BYTES:
            raise ValueError(f"app metadata is {len(app)} B; at most {MAX_APP_BYTES}")
        lay = layout(n, self._one_thread)
        if dst.nbytes < lay.size:
            raise ValueError(f"out must be a writable buffer of at least {lay.size} bytes")
        tenant, generation = binding.tenant, binding.generation
        epoch, aead = self.keyring.seal_key(tenant, generation, lay.count + 1)
        _, _, head, named = self._own_for(tenant, generation, epoch)
        pre = head + bytes(binding.slot_id)
        nonces = _nonce_bytes(lay.nonces)
        record_nonce = nonces[:_NONCE]
        dst[:NONCE_END] = pre + record_nonce
        encrypt = aead.fast_encrypt_into
        encrypt(record_nonce, lay.meta if not app else meta_plain(lay, app),
                meta_aad(pre, binding.tier), dst[NONCE_END:HEAD_BYTES])
        prefix = chunk_aad(pre + record_nonce, named, binding, n, lay.count)
        if lay.count == 1:  # one chunk: no loop
            _, _, off, stop, _, index = lay.parts[0]
            dst[off:off + _NONCE] = nonces[_NONCE:]
            encrypt(nonces[_NONCE:], src, prefix + index, dst[off + _NONCE:stop])
        elif n >= PARALLEL_FROM and self._fan.threads > 1:
            parts = lay.parts

            def seal_one(i: int) -> None:
                start, end, off, stop, k, index = parts[i]
                nonce = nonces[k:k + _NONCE]
                dst[off:off + _NONCE] = nonce
                encrypt(nonce, src[start:end], prefix + index, dst[off + _NONCE:stop])

            self._fan.run(lay.count, seal_one, True)
        else:  # one thread: the same steps without a call per chunk
            for start, end, off, stop, k, index in lay.parts:
                nonce = nonces[k:k + _NONCE]
                dst[off:off + _NONCE] = nonce
                encrypt(nonce, src[start:end], prefix + index, dst[off + _NONCE:stop])
        if lay.size > lay.used:  # noise: a slot's old bytes never ride along, and the end
            prim.fill_noise(dst[lay.used:lay.size])  # of the sealed data does not show
        return lay.size

    # -- opening ---------------------------------------------------------------------------
    def read_meta(self, record: object, tier: int, tenant: str | None = None,
                  generation: int | None = None) -> SealedMeta:
        """Open a record's meta block. With no ``tenant``, the key id is looked up among
        the keyring's live keys (a restarted store rebuilding its index). Raises
        ``InvalidSeal`` for anything that is not an intact record under a live key."""
        return SealedMeta(*self._open_head(_flat(record), tier, tenant, generation)[:8])

    def _open_head(self, src: memoryview, tier: int, tenant: str | None,
                   generation: int | None) -> _Head:
        """What ``read_meta`` reads, plus the data key that opened the meta block and the
        preamble (``open_into`` goes on to the chunks with them)."""
        if src.nbytes < HEAD_BYTES:
            raise InvalidSeal("sealed record does not open")
        pre_nonce = bytes(src[:NONCE_END])
        pre = pre_nonce[:PREAMBLE_BYTES]
        magic, version, flags, reserved, key_id, epoch, slot_id = _PRE.unpack(pre)
        if magic != MAGIC or version != VERSION or flags or reserved:
            raise InvalidSeal("sealed record does not open")
        if tenant is None or generation is None:
            tenant, generation = self._owner(key_id)
        try:
            aead = self.keyring.open_key(tenant, generation, epoch)
        except KeyUnavailable as exc:
            raise InvalidSeal("sealed record does not open") from exc
        own = self._own_for(tenant, generation, epoch)
        if not hmac.compare_digest(key_id, own[1]):
            raise InvalidSeal("sealed record does not open")
        meta = bytearray(META_PLAIN_BYTES)
        try:
            aead.fast_decrypt_into(pre_nonce[PREAMBLE_BYTES:], src[NONCE_END:HEAD_BYTES],
                                   meta_aad(pre, tier), meta)
        except prim.OPEN_FAILED:
            raise InvalidSeal("sealed record does not open") from None
        n, chunk, count, app_len = _META.unpack_from(meta)
        if (chunk == 0 or count != max(1, -(-n // chunk)) or app_len > MAX_APP_BYTES
                or src.nbytes < HEAD_BYTES + n + count * CHUNK_OVERHEAD):
            raise InvalidSeal("sealed record does not open")  # truncated: a chunk is missing
        return (tenant, generation, epoch, slot_id, n, chunk, count,
                bytes(meta[_META.size:_META.size + app_len]), aead, pre_nonce, own[3])

    def _chunk_key(self, src: memoryview, meta: SealedMeta, binding: Binding
                   ) -> tuple[prim.Aead, bytes] | None:
        """The data key and the chunks' shared AAD for opening ``meta``'s chunks under
        ``binding``; None when the binding is not the record's or its key is gone."""
        if (binding.tenant, binding.generation) != (meta.tenant, meta.generation) or \
                not hmac.compare_digest(bytes(binding.slot_id), meta.slot_id):
            return None
        try:
            aead = self.keyring.open_key(meta.tenant, meta.generation, meta.epoch)
        except KeyUnavailable:  # erased since the meta block opened
            return None
        prefix = chunk_aad(bytes(src[:NONCE_END]), tenant_part(binding.tenant), binding,
                            meta.nbytes, meta.chunks)
        return aead, prefix

    def opener(self, record: object, meta: SealedMeta, binding: Binding
               ) -> Callable[[int, object], bool]:
        """``open_chunk(i, out)``: opens chunk ``i`` of ``record`` into ``out`` (its plaintext
        length); False (and ``out`` zeroed) when it does not open. For pipelines that hand
        each chunk on as soon as it opened; ``open_into`` opens them all."""
        src = _flat(record)
        found = self._chunk_key(src, meta, binding)
        if found is None:
            return lambda i, out: False
        aead, prefix = found

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
        src = _flat(record)
        found: tuple[prim.Aead, bytes] | None
        if meta is None:  # the key and preamble that open the meta block open the chunks
            _, _, _, slot_id, n, chunk, count, _, aead, pre_nonce, named = self._open_head(
                src, binding.tier, binding.tenant, binding.generation)
            found = None
            if hmac.compare_digest(bytes(binding.slot_id), slot_id):
                found = aead, chunk_aad(pre_nonce, named, binding, n, count)
        else:
            n, chunk, count = meta.nbytes, meta.chunk, meta.chunks
            found = self._chunk_key(src, meta, binding)
        dst = memoryview(bytearray(n)) if out is None else _flat(out, writable=True)
        if dst.nbytes < n:
            raise ValueError(f"out must be a writable buffer of at least {n} bytes")
        ok = found is not None
        if found is not None:
            decrypt, prefix = found[0].fast_decrypt_into, found[1]
            pieces = parts(n, chunk, count)
            if count == 1:  # one chunk: no loop
                _, _, off, stop, _, index = pieces[0]
                try:
                    decrypt(src[off:off + _NONCE], src[off + _NONCE:stop], prefix + index,
                            dst[:n])
                except prim.OPEN_FAILED:
                    ok = False
            elif n >= PARALLEL_FROM and self._fan.threads > 1:
                failed: list[int] = []

                def one(i: int) -> None:
                    start, end, off, stop, _, index = pieces[i]
                    try:
                        decrypt(src[off:off + prim.NONCE_BYTES],
                                src[off + prim.NONCE_BYTES:stop], prefix + index,
                                dst[start:end])
                    except prim.OPEN_FAILED:
                        failed.append(i)

                self._fan.run(count, one, True)
                ok = not failed
            else:  # one thread: the same steps without a call per chunk
                try:
                    for start, end, off, stop, _, index in pieces:
                        decrypt(src[off:off + prim.NONCE_BYTES],
                                src[off + prim.NONCE_BYTES:stop], prefix + index,
                                dst[start:end])
                except prim.OPEN_FAILED:
                    ok = False
        if not ok:  # never leave unauthenticated plaintext behind
            np.frombuffer(dst, np.uint8, n).fill(0)
            raise InvalidSeal("sealed record does not open")
        return dst[:n]
