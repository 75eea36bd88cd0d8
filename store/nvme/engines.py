"""File engines of NVMe shards: how a record's bytes reach the segment file and come back.

``SyscallEngine`` (the default) calls ``os.pwritev`` / ``os.preadv`` straight
on the caller's buffers: one gather write of header + payload, no staging copy,
no job objects. A payload of more than one 1 MiB stripe (format version 2) is
read stripe by stripe, each hashed right after its read while still in cache;
from ``PARALLEL_BYTES`` up (and ``read_threads=2``) a helper thread takes
stripes too (``os.preadv`` and XXH3 both release the GIL), so the verify pass
runs beside the copy on a second core instead of after it. One read, then one
hash, for records up to a stripe. (Hashing a large payload on the helper while
this thread writes it was tried and dropped: on the shared 2-core machine it
came out 0.74-0.93 of raw at 4-16 MiB against 0.79-0.88 for hash-then-write.)

``NixlEngine`` moves the same bytes as NIXL POSIX transfer jobs. It pays off
where a job queue does (batched, asynchronous or GPU-direct I/O); for one
synchronous record from the page cache each job costs tens of µs of Python and
NIXL bookkeeping, so it is not the default. Both verify every read against the
record's payload hash and raise ``OSError`` (with the errno) on a failed write.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from typing import Any

import numpy as np

from store.buffers import aligned_buffer
from store.nvme import format as fmt
from store.nvme.files import writable_view
from store.nvme.types import NvmeEngine, NvmeShardConfig, RecordLocation, ShardError
from store.transport import (
    FileSpan,
    Region,
    TransferJob,
    TransferOp,
    TransferStatus,
    Transport,
    file_transport,
    nixl_available,
)

# Records this large are read on two cores; below, a helper that wakes late costs more
# than it saves (measured at 2 MiB on a shared 2-core machine).
PARALLEL_BYTES = 4 * fmt.STRIPE_BYTES
_FILE_SPAN = 1 << 40  # offsets a NIXL file registration admits; it allocates nothing
_STAGE_BYTES = 1 << 20  # NIXL: header + payload up to this size go out in one job


def open_engine(config: NvmeShardConfig) -> SyscallEngine | NixlEngine:
    if config.engine is NvmeEngine.SYSCALL:
        return SyscallEngine(two_threads=config.read_threads == 2)
    if not nixl_available():
        raise ShardError("engine nixl-posix needs NIXL, which is not installed")
    return NixlEngine(file_transport(prefer_nixl=True), max(_STAGE_BYTES, 2 * config.align))


def read_full(fd: int, view: memoryview, offset: int) -> bool:
    """Fill ``view`` from ``offset``; False when the file ends first or the read fails."""
    n = view.nbytes
    try:
        done = os.preadv(fd, [view], offset)  # one call, unless the read comes back short
        while done < n:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got == 0:
                return False
            done += got
    except OSError:
        return False
    return True


def write_all(fd: int, parts: list[memoryview], offset: int) -> None:
    """``os.pwritev`` of ``parts`` at ``offset``, short writes continued."""
    wrote = os.pwritev(fd, parts, offset)
    if wrote == sum(p.nbytes for p in parts):  # nearly always: one call
        return
    while parts:
        if wrote <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += wrote
        while parts and wrote >= parts[0].nbytes:
            wrote -= parts.pop(0).nbytes
        if parts and wrote:
            parts[0] = parts[0][wrote:]
        if parts:
            wrote = os.pwritev(fd, parts, offset)


def read_stripes(fd: int, view: memoryview, offset: int) -> list[int] | None:
    """Fill ``view`` stripe by stripe, hashing each while it is still in cache."""
    digests = []
    for start in range(0, view.nbytes, fmt.STRIPE_BYTES):
        stripe = view[start : start + fmt.STRIPE_BYTES]
        if not read_full(fd, stripe, offset + start):
            return None
        digests.append(fmt.checksum(stripe))
    return digests


class _Job:
    """One record's stripes, claimed one at a time by whichever thread is free."""

    __slots__ = ("digests", "failed", "fd", "helper_idle", "next", "offset", "view")

    def __init__(self, fd: int, view: memoryview, offset: int) -> None:
        self.fd, self.view, self.offset = fd, view, offset
        self.digests: list[int] = [0] * -(-view.nbytes // fmt.STRIPE_BYTES)
        self.next = 0
        self.failed = False
        self.helper_idle = threading.Event()
        self.helper_idle.set()


class _StripeHelper:
    """A helper thread that shares a record's stripes with the reading thread: each takes the
    next stripe, reads it and hashes it while it is still in cache (``os.preadv`` and XXH3
    both release the GIL). A helper that is slow to wake just gets fewer stripes; the reader
    waits only for a stripe the helper has already begun."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._todo: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="nvme-verify", daemon=True)
        self._thread.start()

    def _claim(self, job: _Job, helper: bool) -> int | None:
        with self._lock:
            if job.failed or job.next == len(job.digests):
                return None
            index, job.next = job.next, job.next + 1
            if helper:
                job.helper_idle.clear()
            return index

    def _work(self, job: _Job, helper: bool) -> None:
        while (index := self._claim(job, helper)) is not None:
            start = index * fmt.STRIPE_BYTES
            stripe = job.view[start : start + fmt.STRIPE_BYTES]
            ok = read_full(job.fd, stripe, job.offset + start)
            if ok:
                job.digests[index] = fmt.checksum(stripe)
            else:
                job.failed = True
            if helper:
                job.helper_idle.set()

    def _run(self) -> None:
        while (job := self._todo.get()) is not None:
            try:
                self._work(job, helper=True)
            except Exception:  # noqa: BLE001 - reported as a failed read
                job.failed = True
                job.helper_idle.set()

    def read_verified(self, fd: int, view: memoryview, offset: int, digest: int) -> bool:
        job = _Job(fd, view, offset)
        self._todo.put(job)
        try:
            self._work(job, helper=False)
        finally:
            with self._lock:  # no stripe is claimed after this; wait for one in flight
                job.failed = job.failed or job.next < len(job.digests)
            job.helper_idle.wait()
        return not job.failed and fmt.combine(job.digests) == digest

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join()


class SyscallEngine:
    """Direct ``os.pwritev`` / ``os.preadv`` on the caller's buffers."""

    name = NvmeEngine.SYSCALL.value

    def __init__(self, two_threads: bool = True) -> None:
        self._parallel_from = PARALLEL_BYTES if two_threads else None
        self._buf: np.ndarray | None = None
        self._helper: _StripeHelper | None = None

    def attach(self, fd: int) -> int:
        return fd

    def detach(self, handle: int) -> None:
        pass

    def write(self, fd: int, offset: int, header: memoryview, payload: memoryview) -> None:
        """Header block + payload in one gather write (short writes continued)."""
        write_all(fd, [header, payload] if payload.nbytes else [header], offset)

    def read(self, fd: int, loc: RecordLocation, out: Any) -> memoryview | None:
        """The verified payload (a view of ``out``, or of an internal buffer); None if it
        fails verification or its bytes are gone."""
        n, offset = loc.length, loc.payload_offset
        view = writable_view(out, n)[:n] if out is not None else self._scratch(n)
        parallel = self._parallel_from is not None and n >= self._parallel_from
        if loc.version >= 2 and parallel:
            if self._helper is None:
                self._helper = _StripeHelper()
            ok = self._helper.read_verified(fd, view, offset, loc.checksum)
        elif loc.version >= 2 and n > fmt.STRIPE_BYTES:
            digests = read_stripes(fd, view, offset)
            ok = digests is not None and fmt.combine(digests) == loc.checksum
        else:  # up to one stripe, or a version 1 record: one XXH3-64 over the payload
            ok = read_full(fd, view, offset) and fmt.checksum(view) == loc.checksum
        return view if ok else None

    def _scratch(self, n: int) -> memoryview:
        if self._buf is None or self._buf.nbytes < n:
            self._buf = aligned_buffer(fmt.round_up(max(n, 1 << 20), 4096))
        return memoryview(self._buf)[:n]

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None


class NixlEngine:
    """The same record I/O as NIXL POSIX transfer jobs over registered memory and files."""

    name = NvmeEngine.NIXL_POSIX.value

    def __init__(self, transport: Transport, stage_bytes: int) -> None:
        self._io = transport
        self._scratch = aligned_buffer(stage_bytes)
        self._read_buf: np.ndarray | None = None
        self._read_region: Region | None = None
        self._out_cache: tuple[Any, np.ndarray, Region] | None = None
        try:
            self._scratch_region = self._io.register(self._scratch)
        except BaseException:
            self._io.close()
            raise

    def attach(self, fd: int) -> Region:
        return self._io.register(FileSpan(fd=fd, length=_FILE_SPAN))

    def detach(self, handle: Region) -> None:
        self._io.deregister(handle)

    def write(self, file: Region, offset: int, header: memoryview, payload: memoryview) -> None:
        """Small records staged into one job, large ones in two (a copy into the staging
        buffer costs less than a second job up to _STAGE_BYTES)."""
        block, n = header.nbytes, payload.nbytes
        self._scratch[:block] = np.frombuffer(header, np.uint8)
        if block + n <= self._scratch.nbytes:
            if n:
                self._scratch[block : block + n] = np.frombuffer(payload, np.uint8)
            self._check(self._run(TransferOp.WRITE, self._scratch_region, file, offset, block + n))
            return
        region = self._io.register(np.frombuffer(payload, np.uint8))
        try:
            jobs = [
                self._submit(TransferOp.WRITE, self._scratch_region, file, offset, block),
                self._submit(TransferOp.WRITE, region, file, offset + block, n),
            ]
            results = [self._io.wait(j) for j in jobs]
        finally:
            self._io.deregister(region)
        for result in results:
            self._check(result)

    @staticmethod
    def _check(result: Any) -> None:
        if result.status is not TransferStatus.DONE:
            raise OSError(result.errno or errno.EIO, result.error)

    def read(self, file: Region, loc: RecordLocation, out: Any) -> memoryview | None:
        n = loc.length
        if out is None:
            if self._read_buf is None or self._read_buf.nbytes < n:
                self._grow_read_buffer(n)
            region, target = self._read_region, self._read_buf
        else:
            region, target = self._out_region(out, n)
        result = self._run(TransferOp.READ, region, file, loc.payload_offset, n)
        view = memoryview(target)[:n]
        if result.status is not TransferStatus.DONE:
            return None
        return view if fmt.payload_digest(view, loc.version) == loc.checksum else None

    def _submit(self, op: TransferOp, local: Region, file: Region, offset: int, n: int) -> int:
        job = TransferJob(op=op, local=local, remote=file, length=n, remote_offset=offset)
        return self._io.submit(job)

    def _run(self, op: TransferOp, local: Region, file: Region, offset: int, n: int) -> Any:
        return self._io.wait(self._submit(op, local, file, offset, n))

    def _out_region(self, out: Any, n: int) -> tuple[Region, np.ndarray]:
        """The registration of a caller's ``out`` buffer. The last one is kept (with a view
        that pins its memory), since callers usually read into the same buffer again."""
        cached = self._out_cache
        if cached is not None and cached[0] is out:
            target, region = cached[1], cached[2]
        else:
            target = np.frombuffer(writable_view(out, 0), np.uint8)
            if cached is not None:
                self._io.deregister(cached[2])
                self._out_cache = None
            region = self._io.register(target)
            self._out_cache = (out, target, region)
        writable_view(target, n)  # refuses a buffer smaller than the record
        return region, target

    def _grow_read_buffer(self, n: int) -> None:
        if self._read_region is not None:
            self._io.deregister(self._read_region)
        self._read_buf = aligned_buffer(fmt.round_up(max(n, 1 << 20), 4096))
        self._read_region = self._io.register(self._read_buf)

    def close(self) -> None:
        self._io.close()  # drops every registration, then the files can go
