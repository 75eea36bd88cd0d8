"""The pool actor's restore pipeline: open a record's sealed chunks, push each by NIXL as it opens.

Chunk 0 opens in the request thread while opener threads (one per other core) start on
the next ones; the request thread pushes every chunk as soon as it is open and checked.
AES-GCM and the NIXL copy (UCX copies inside ``transfer``) both run without the GIL, so
decryption hides behind the copy. A chunk is pushed only after its tag verified, so torn
or tampered bytes never reach the destination as page data. Records of either format
(``pool_records``) open here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from agentkv_cluster.runtime.mover import MoveError, Mover, RemoteSpan
from agentkv_cluster.runtime.pool_records import (
    StoredCopy,
    binding_of,
    chunk_slot,
    chunks,
    parse,
)
from security.chunked import ChunkedSealer, default_threads, is_chunked
from security.errors import InvalidSeal
from security.sealing import TenantSealer, sealed_size

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
                    RemoteSpan(endpoint=dst.endpoint, region=dst.region,
                               offset=dst.offset + start, length=stop - start)))
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
