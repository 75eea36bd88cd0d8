"""LocalCopyTransport: the fallback that needs nothing but numpy and the OS.

Memory to memory inside one process (numpy or torch copies) and memory to file
(``os.pwrite`` / ``os.preadv``, short writes and reads handled). Jobs run
synchronously in ``submit``; their results wait in ``get_finished``.
"""

from __future__ import annotations

import ctypes
import os
import uuid
from typing import Any

import numpy as np

from store.transport.base import (
    FileSpan,
    InvalidTransfer,
    JobBook,
    MemKind,
    Region,
    TransferJob,
    TransferOp,
    TransferResult,
    TransferStatus,
    UnknownPeer,
    memory_address,
)


def _view(buffer: Any, addr: int, length: int, kind: MemKind) -> Any:
    """A flat uint8 view of a registered buffer (numpy for DRAM, torch for VRAM)."""
    if kind is MemKind.VRAM:
        import torch  # VRAM buffers are always torch tensors

        return buffer.reshape(-1).view(torch.uint8)
    return np.frombuffer((ctypes.c_uint8 * length).from_address(addr), dtype=np.uint8)


class LocalCopyTransport(JobBook):
    """Copies between regions this transport registered itself."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name or f"local-{uuid.uuid4().hex[:12]}"
        # (addr, length) -> (owner object kept alive, flat uint8 view)
        self._mem: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._files: set[int] = set()
        self._finished: list[TransferResult] = []

    def register(self, buffer: Any) -> Region:
        self._check_open()
        if isinstance(buffer, FileSpan):
            if buffer.length <= 0:
                raise InvalidTransfer("file span length must be positive")
            self._files.add(buffer.fd)
            return Region(
                kind=MemKind.FILE, addr=0, length=buffer.length, device=buffer.fd, owner=self.name
            )
        info = memory_address(buffer)
        self._note_memory(info)
        addr, length, kind, device = info.addr, info.length, info.kind, info.device
        self._mem[(addr, length)] = (buffer, _view(buffer, addr, length, kind))
        return Region(kind=kind, addr=addr, length=length, device=device, owner=self.name)

    def deregister(self, region: Region) -> None:
        if region.kind is MemKind.FILE:
            self._files.discard(region.device)
        else:
            self._mem.pop((region.addr, region.length), None)

    def _mem_view(self, region: Region) -> Any:
        try:
            return self._mem[(region.addr, region.length)][1]
        except KeyError:
            raise InvalidTransfer(f"region at {region.addr:#x} is not registered") from None

    def submit(self, job: TransferJob) -> int:
        self._check_open()
        job.validate()
        self._check_destination(job)
        if job.remote.owner != self.name:
            raise UnknownPeer(f"{self.name} cannot reach regions of {job.remote.owner!r}")
        local = self._mem_view(job.local)[job.local_offset : job.local_offset + job.length]
        if job.remote.kind is MemKind.FILE:
            if job.remote.device not in self._files:
                raise InvalidTransfer(f"file descriptor {job.remote.device} is not registered")
            remote = None
        else:
            view = self._mem_view(job.remote)
            remote = view[job.remote_offset : job.remote_offset + job.length]
        job_id = self._new_id()
        self._finished.append(self._run(job_id, job, local, remote))
        return job_id

    def _run(self, job_id: int, job: TransferJob, local: Any, remote: Any) -> TransferResult:
        try:
            if remote is None:
                moved = _file_io(job, local)
            else:
                src, dst = (local, remote) if job.op is TransferOp.WRITE else (remote, local)
                _copy(dst, src)
                moved = job.length
        except OSError as exc:
            return TransferResult(job_id, TransferStatus.FAILED, 0, str(exc), exc.errno or 0)
        if moved != job.length:
            return TransferResult(
                job_id,
                TransferStatus.FAILED,
                moved,
                f"short transfer: {moved} of {job.length} bytes",
            )
        return TransferResult(job_id, TransferStatus.DONE, moved)

    def _poll(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def close(self) -> None:
        self._mem.clear()
        self._files.clear()
        self._closed = True


def _copy(dst: Any, src: Any) -> None:
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.copyto(dst, src)
        return
    import torch  # only reached when a VRAM tensor takes part

    as_t = lambda x: x if isinstance(x, torch.Tensor) else torch.from_numpy(x)
    as_t(dst).copy_(as_t(src))


def _file_io(job: TransferJob, local: np.ndarray) -> int:
    """Move ``local`` to/from the file at ``remote_offset``; returns bytes moved."""
    fd, offset, done = job.remote.device, job.remote_offset, 0
    mv = memoryview(local)
    while done < job.length:
        if job.op is TransferOp.WRITE:
            n = os.pwrite(fd, mv[done:], offset + done)
        else:
            n = os.preadv(fd, [mv[done:]], offset + done)
        if n == 0:  # EOF on read (a write of 0 bytes does not happen for len > 0)
            break
        done += n
    return done
