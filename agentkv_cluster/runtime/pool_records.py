"""The pool actor's stored records: their formats, and the restore pipeline that opens
them into a NIXL push.

Version 2 (written now) is a ``security.chunked`` record: in the clear only the format
version, an opaque key id and the blinded slot identity (a hash of the blinded page key
and codec, also the record's NVMe key); the page's index entry (key, namespace, codec,
location id, generations, lengths, state type, shape, structured) is sealed in its meta block, and
the record is padded to a size class. A restarted actor opens the meta blocks with the
keyring to rebuild its index; records of an erased tenant no longer open and are dropped.

Version 1 (still read): ``magic "AKVR" ‖ header length ‖ msgpack header ‖ sealed chunk 0
‖ ...`` with a plaintext header and ``TenantSealer`` chunks bound to the location id, the
chunk index and a last-chunk flag, stored under NVMe key ``key ‖ codec``.

Restores (``ChunkOpener``): chunk 0 opens in the request thread while opener threads
(one per other core) start on the next ones; the request thread pushes every chunk as
soon as it is open and checked. AES-GCM and the NIXL copy (UCX copies inside
``transfer``) both run without the GIL, so decryption hides behind the copy. A chunk is
pushed only after its tag verified, so torn or tampered bytes never reach the
destination as page data. Records of either format open there.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

import msgpack

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.mover import MoveError, Mover, RemoteSpan
from agentkv_cluster.runtime.records import KvShape, PoolHolding
from security.chunked import Binding, ChunkedSealer, default_threads, is_chunked, record_size
from security.errors import InvalidSeal
from security.sealing import TenantSealer, sealed_size
from store.buffers import aligned_buffer
from store.types import Codec, Tier

_REC = struct.Struct(">4sI")  # version 1: magic, header length
_MAGIC = b"AKVR"
# Version 1 sealed pages in 2 MiB chunks.
SEAL_CHUNK = 2 << 20  # bytes per AES-GCM chunk of a sealed pool record
_SLOT_DOMAIN = b"agentkv/pool-slot/v1\0"


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
    structured: bool = False  # feeds code or JSON output (``PageMeta.structured``)
    nkey: bytes = b""  # NVMe key; version 2: the blinded slot identity
    version: int = 2  # record format


def sealed_total(n: int, chunk: int = SEAL_CHUNK) -> int:
    """Bytes a record of an ``n``-byte page takes at most, in either format."""
    chunks_v1 = max(1, -(-n // chunk))
    return max(n + chunks_v1 * sealed_size(0), record_size(n))


def slot_identity(key: bytes, codec: Codec) -> bytes:
    """The blinded slot identity of a (key, codec) copy: 32 opaque bytes (the key is
    already a per-tenant keyed hash), the only name a version-2 record shows."""
    return hashlib.sha256(_SLOT_DOMAIN + key + bytes((int(codec),))).digest()


def legacy_nvme_key(key: bytes, codec: Codec) -> bytes:
    """Where version 1 stored a copy on NVMe."""
    return key + bytes((int(codec),))


def chunk_slot(loc: int, index: int, last: bool) -> int:
    """Version 1: the seal binding of one chunk: its index, and a flag on the final chunk
    so a record cut short (an edited length in the plaintext header) fails to open."""
    return loc * 4096 + (2048 if last else 0) + index


def chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of an n-byte page; chunk 0 = whole page."""
    if chunk <= 0:
        return [(0, n)]
    return [(off, min(chunk, n - off)) for off in range(0, max(n, 1), chunk)]


def app_header(key: bytes, codec: Codec, copy: StoredCopy) -> bytes:
    """The index entry sealed inside a version-2 record's meta block."""
    return msgpack.packb({"k": key, "ns": copy.namespace, "c": int(codec), "loc": copy.loc,
                          "sg": copy.seal_gen, "dg": copy.dir_gen, "n": copy.nbytes,
                          "fl": copy.full, "st": copy.state_type, "sh": copy.shape,
                          "sx": copy.structured})


def binding_of(copy: StoredCopy, digest: bytes) -> Binding:
    return Binding(tenant=copy.namespace, generation=copy.seal_gen, tier=int(copy.tier),
                   slot_id=copy.nkey, digest=digest, location=copy.loc)


class RecordBuffers:
    """Pre-faulted record-sized buffers that stores seal NVMe records into and restores read
    them into (first-touch memory runs at ~0.7 GB/s here). Each caller takes its own, so
    stores and restores of different pages run at once; a buffer goes back for reuse."""

    def __init__(self, record_bytes: int) -> None:
        self.record_bytes = record_bytes
        self._free: SimpleQueue[Any] = SimpleQueue()
        self._free.put(aligned_buffer(record_bytes))  # one faulted in up front

    @contextmanager
    def take(self) -> Iterator[Any]:
        try:
            buf = self._free.get_nowait()
        except Empty:
            buf = aligned_buffer(self.record_bytes)
        try:
            yield buf
        finally:
            self._free.put(buf)


class RecordSealer:
    """The write side of ``ChunkOpener``: seals a page as a version-2 record straight into a
    reserved host-pool slot (reserve -> seal in place -> commit), or into a record buffer
    for the NVMe shard. Many stores may seal at once, each into its own buffer."""

    def __init__(self, sealer: ChunkedSealer, buffers: RecordBuffers) -> None:
        self.sealer = sealer
        self.buffers = buffers

    def seal(self, out: Any, key: bytes, codec: Codec, copy: StoredCopy, digest: bytes,
             plain: Any) -> int:
        """Seal ``plain`` into ``out``; returns the record's size."""
        copy.nkey, copy.version = slot_identity(key, codec), 2
        return self.sealer.seal_into(out, plain, binding_of(copy, digest),
                                     app_header(key, codec, copy))

    def into_slot(self, host: Any, key: bytes, codec: Codec, copy: StoredCopy, digest: bytes,
                  plain: Any) -> None:
        """Seal into ``copy.slot`` of ``host`` (allocated by the caller, who frees it if
        this raises: the slot is left allocated and empty)."""
        view = host.reserve(copy.slot, host.slot_bytes)
        try:
            size = self.seal(view, key, codec, copy, digest, plain)
        except BaseException:
            host.abort(copy.slot)
            raise
        host.commit(copy.slot, size)

    def to_nvme(self, nvme: Any, key: bytes, codec: Codec, copy: StoredCopy, digest: bytes,
                plain: Any) -> None:
        """Seal into a record buffer and write it to ``nvme`` under ``copy.nkey``. The
        record's length says only its size class; no generation in clear."""
        with self.buffers.take() as buf:
            size = self.seal(buf, key, codec, copy, digest, plain)
            nvme.put(copy.nkey, buf[:size], 0)


def holding_of(found: list[tuple[Codec, StoredCopy]]) -> PoolHolding:
    """What a pool holds of one page, from its copies (at least one) by codec; structured
    if any copy was stored so (a copy stored before a storer's flag came is not)."""
    first = found[0][1]
    return PoolHolding(copies=tuple((x.tier, c) for c, x in found), length=first.full,
                       state_type=StateType(first.state_type),
                       shape=KvShape.from_stored(first.shape),
                       structured=any(x.structured for _, x in found))


def read_entry(sealer: ChunkedSealer, record: bytes | memoryview, tier: Tier, slot: int
               ) -> tuple[bytes, Codec, StoredCopy]:
    """The page key, form and index entry of a record in either format; ValueError if it
    is not one (a header missing a field, or holding one of the wrong type, included) or,
    for version 2, does not open under a live key: an erased tenant's records."""
    if is_chunked(record):
        try:
            meta = sealer.read_meta(record, int(tier))
        except InvalidSeal:
            raise ValueError("record does not open under any live key") from None
        header = msgpack.unpackb(meta.app, raw=False)
        if not isinstance(header, dict) or header.get("ns") != meta.tenant:
            raise ValueError("record meta is not an index entry")
        version = 2
    else:
        header, version = parse(record)[0], 1
    try:
        key, codec = header["k"], Codec(header["c"])
        nkey = slot_identity(key, codec) if version == 2 else legacy_nvme_key(key, codec)
        copy = StoredCopy(tier=tier, slot=slot, loc=header["loc"], seal_gen=header["sg"],
                          dir_gen=header["dg"], nbytes=header["n"], namespace=header["ns"],
                          full=header.get("fl", header["n"]),
                          state_type=header.get("st", "temp_reasoning"),
                          shape=header.get("sh"), structured=header.get("sx", False),
                          nkey=nkey, version=version)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"record header is not an index entry: {exc!r}") from None
    ints = (copy.loc, copy.seal_gen, copy.dir_gen, copy.nbytes, copy.full)
    if not (isinstance(key, bytes) and isinstance(copy.namespace, str)
            and all(isinstance(v, int) for v in ints) and isinstance(copy.structured, bool)):
        raise ValueError("record header is not an index entry: a field of the wrong type")
    return key, codec, copy


def parse(record: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """Version 1: (header, sealed chunks) of a record; ValueError if it is not one."""
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


def build_record_v1(sealer: Any, key: bytes, codec: Codec, copy: StoredCopy, digest: bytes,
                    plain: Any) -> bytearray:
    """A version-1 record (``sealer`` a ``TenantSealer``): only tests that read old records
    write one now."""
    header = msgpack.packb({"k": key, "ns": copy.namespace, "c": int(codec), "loc": copy.loc,
                            "sg": copy.seal_gen, "dg": copy.dir_gen, "n": copy.nbytes,
                            "ch": SEAL_CHUNK, "fl": copy.full, "st": copy.state_type,
                            "sh": copy.shape})
    parts = chunks(len(plain), SEAL_CHUNK)
    record = bytearray(_REC.size + len(header) + len(plain) + len(parts) * sealed_size(0))
    _REC.pack_into(record, 0, _MAGIC, len(header))
    record[_REC.size:_REC.size + len(header)] = header
    out, src = _REC.size + len(header), memoryview(plain)
    for i, (off, n) in enumerate(parts):
        sealer.seal(copy.namespace, digest, copy.seal_gen, int(copy.tier),
                    chunk_slot(copy.loc, i, i == len(parts) - 1), src[off:off + n],
                    out=memoryview(record)[out:out + sealed_size(n)])
        out += sealed_size(n)
    copy.nkey, copy.version = legacy_nvme_key(key, codec), 1
    return record


# -- the restore pipeline ----------------------------------------------------------------
OpenChunk = Callable[[int, Any], bool]


class SealRejected(Exception):
    """A stored copy failed to open (tampered, wrong binding, erased key): counted, not served."""


class ChunkOpener:
    """Opens sealed records into a ``Mover``'s staging slots and pushes them to peers."""

    def __init__(self, sealer: TenantSealer, chunked: ChunkedSealer, mover: Mover,
                 name: str) -> None:
        self.sealer = sealer
        self.chunked = chunked
        self.mover = mover
        self._pool = ThreadPoolExecutor(max(1, default_threads() - 1),
                                        thread_name_prefix=f"open-{name}")
        self._lock = threading.Lock()
        self.rejects = 0

    def open_and_push(self, digest: bytes, copy: StoredCopy, record: bytes | memoryview,
                      slot: int, dst: RemoteSpan, stable: Callable[[], bool] | None = None
                      ) -> bool:
        """Open ``record`` (``copy``'s bytes) into staging ``slot`` and push the plaintext to
        ``dst``. With ``stable`` (a zero-copy read of bytes a writer may replace), a chunk is
        pushed only if ``stable()`` still holds after it opened; False = it did not (torn:
        the caller retries; a failed tag on torn bytes is not tampering). Raises
        ``SealRejected`` when a chunk of unchanged bytes fails to open, ``MoveError`` when
        the copy is larger than ``dst`` (nothing is pushed)."""
        if copy.nbytes > dst.length:
            raise MoveError(f"a {copy.nbytes} B copy does not fit a {dst.length} B span")
        jobs: list[int] = []
        try:
            ok = self._open_chunks(digest, copy, record, slot, dst, stable, jobs)
        except BaseException:
            self.mover.drain(jobs)  # the staging slot is reused once these land
            raise
        self.mover.wait_all(jobs)
        return ok

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _open_chunks(self, digest: bytes, copy: StoredCopy, record: bytes | memoryview,
                     slot: int, dst: RemoteSpan, stable: Callable[[], bool] | None,
                     jobs: list[int]) -> bool:
        torn = stable is not None
        try:
            parts, open_chunk = self._plan(digest, copy, record)
        except ValueError:  # not a record at all
            if torn and not stable():
                return False
            raise
        except InvalidSeal:  # its meta block does not open: tampered, or the key is gone
            if torn and not stable():
                return False
            with self._lock:
                self.rejects += 1
            raise SealRejected("stored copy failed to open") from None
        opens, first = self._queue(open_chunk, slot, parts)
        base = slot * self.mover.slot_bytes
        try:
            opens[0].set_result(open_chunk(*first))
            ready = 0  # chunks opened, checked and pushed
            while ready < len(parts):
                # Push the next chunk with every chunk after it that is already open: small
                # writes while the pipeline fills, larger ones once the opener runs ahead.
                end = ready + 1
                while end < len(parts) and opens[end].done():
                    end += 1
                failed = not all(opened.result() for opened in opens[ready:end])
                if torn and not stable():
                    return False
                if failed:
                    with self._lock:
                        self.rejects += 1
                    raise SealRejected("stored copy failed to open")
                start, stop = parts[ready][0], parts[end - 1][0] + parts[end - 1][1]
                jobs.append(self.mover.push_async(
                    self.mover.staging_region, base + start,
                    dst.part(start, stop - start)))
                ready = end
            return True
        finally:
            for opened in opens[1:]:
                opened.cancel()
            wait(opens[1:])  # none may still write into the staging slot once it is given back

    def _plan(self, digest: bytes, copy: StoredCopy, record: bytes | memoryview
              ) -> tuple[list[tuple[int, int]], OpenChunk]:
        """The chunks of ``record`` and how to open one; ValueError if it is no record,
        InvalidSeal if a version-2 meta block does not open for ``copy``."""
        if is_chunked(record):
            meta = self.chunked.read_meta(record, int(copy.tier), copy.namespace, copy.seal_gen)
            if meta.nbytes != copy.nbytes:
                raise InvalidSeal("stored copy failed to open")
            return meta.parts(), self.chunked.opener(record, meta, binding_of(copy, digest))
        header, sealed = parse(record)
        chunk = header.get("ch", 0)
        parts = chunks(copy.nbytes, chunk)
        starts = [0]
        for _off, n in parts:
            starts.append(starts[-1] + sealed_size(n))

        def open_chunk(i: int, out: Any) -> bool:
            # Records written before chunking are one message, bound to the bare loc.
            binding = copy.loc if chunk <= 0 else chunk_slot(copy.loc, i, i == len(parts) - 1)
            try:
                self.sealer.open(copy.namespace, digest, copy.seal_gen, int(copy.tier), binding,
                                 sealed[starts[i]:starts[i + 1]], out=out)
            except InvalidSeal:
                return False
            return True

        return parts, open_chunk

    def _queue(self, open_chunk: OpenChunk, slot: int, parts: list[tuple[int, int]]
               ) -> tuple[list[Future[bool]], tuple[int, Any]]:
        """Hand chunks 1.. to the opener threads; returns their futures (after a blank one
        for chunk 0, which the caller opens itself) and chunk 0's arguments."""
        out = self.mover.slot_view(slot)
        opens: list[Future[bool]] = [Future()]
        for i, (off, n) in enumerate(parts[1:], 1):
            opens.append(self._pool.submit(open_chunk, i, out[off:off + n]))
        off, n = parts[0]
        return opens, (0, out[off:off + n])
