"""The transport contract: register buffers, submit copy jobs, drain finished ones.

One interface for every way bytes move: NIXL UCX (memory to memory across
processes), NIXL POSIX (memory to file) and a plain local copy. A job copies
``length`` bytes between a region registered here (``local``) and a region
registered by this or a peer transport (``remote``); WRITE moves local to
remote, READ moves remote to local.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np


class TransportError(Exception):
    """Base class of transport failures."""


class InvalidTransfer(TransportError, ValueError):
    """A job or buffer was rejected before anything moved."""


class UnknownPeer(TransportError):
    """The remote region belongs to an agent this transport has not been introduced to."""


class TransportClosed(TransportError):
    """The transport was used after ``close()``."""


class TransferTimeout(TransportError):
    """``wait`` gave up before the job finished."""


class MemKind(enum.Enum):
    DRAM = "DRAM"
    VRAM = "VRAM"
    FILE = "FILE"


class TransferOp(enum.Enum):
    WRITE = "WRITE"  # local -> remote
    READ = "READ"  # remote -> local


class TransferStatus(enum.Enum):
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class FileSpan:
    """A file (by descriptor) to register; ``length`` bounds the offsets a job may touch."""

    fd: int
    length: int


@dataclass(frozen=True, kw_only=True)
class Region:
    """A registered buffer or file, exportable to a peer as bytes (``pack``)."""

    kind: MemKind
    addr: int  # memory address; 0 for files (offsets are relative)
    length: int
    device: int  # GPU ordinal for memory, file descriptor for files
    owner: str  # name of the transport/agent that registered it

    def pack(self) -> bytes:
        return msgpack.packb([self.kind.value, self.addr, self.length, self.device, self.owner])

    @classmethod
    def unpack(cls, data: bytes) -> Region:
        try:
            kind, addr, length, device, owner = msgpack.unpackb(data)
            return cls(
                kind=MemKind(kind),
                addr=int(addr),
                length=int(length),
                device=int(device),
                owner=str(owner),
            )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise InvalidTransfer(f"not a packed Region: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class TransferJob:
    op: TransferOp
    local: Region
    remote: Region
    length: int
    local_offset: int = 0
    remote_offset: int = 0
    tag: bytes = b""  # delivered to the remote agent as a notification where supported

    def validate(self) -> None:
        """Bounds and kinds; raises InvalidTransfer so nothing moves on a bad job."""
        if self.length <= 0:
            raise InvalidTransfer(f"length must be positive, got {self.length}")
        for name, region, offset in (
            ("local", self.local, self.local_offset),
            ("remote", self.remote, self.remote_offset),
        ):
            if offset < 0 or offset + self.length > region.length:
                raise InvalidTransfer(
                    f"{name} range [{offset}, {offset + self.length}) outside region of "
                    f"{region.length} bytes"
                )
        if self.local.kind is MemKind.FILE:
            raise InvalidTransfer("the local side of a job must be memory, not a file")


@dataclass(slots=True)
class TransferResult:
    job_id: int
    status: TransferStatus
    nbytes: int
    error: str = ""
    errno: int = 0  # OS errno where the backend reports one (ENOSPC...), else 0


@runtime_checkable
class Transport(Protocol):
    name: str

    def register(self, buffer: Any) -> Region: ...

    def deregister(self, region: Region) -> None: ...

    def submit(self, job: TransferJob) -> int: ...

    def get_finished(self) -> list[TransferResult]: ...

    def wait(self, job_id: int, timeout_s: float = 30.0) -> TransferResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    addr: int
    length: int
    kind: MemKind
    device: int
    writable: bool


def memory_address(buffer: Any) -> MemoryInfo:
    """Where a contiguous numpy array, torch tensor or buffer-protocol object lives."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "is_contiguous"):  # torch tensor
        if not buffer.is_contiguous():
            raise InvalidTransfer("tensor must be contiguous")
        length = buffer.numel() * buffer.element_size()
        if buffer.device.type == "cuda":
            return MemoryInfo(
                buffer.data_ptr(), length, MemKind.VRAM, buffer.device.index or 0, True
            )
        return MemoryInfo(buffer.data_ptr(), length, MemKind.DRAM, 0, True)
    try:
        array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, np.uint8)
    except (TypeError, ValueError) as exc:
        raise InvalidTransfer(f"cannot register {type(buffer).__name__}: {exc}") from exc
    if not array.flags.c_contiguous:
        raise InvalidTransfer("array must be C-contiguous")
    if array.nbytes == 0:
        raise InvalidTransfer("cannot register an empty buffer")
    return MemoryInfo(array.ctypes.data, array.nbytes, MemKind.DRAM, 0, bool(array.flags.writeable))


class JobBook:
    """Finished-job bookkeeping shared by the implementations.

    Subclasses implement ``_poll() -> list[TransferResult]`` (newly finished jobs).
    """

    name: str

    def __init__(self) -> None:
        self._next_id = 1
        self._done: dict[int, TransferResult] = {}
        self._closed = False
        self._readonly: set[tuple[int, int]] = set()  # registered memory jobs must not write

    def _note_memory(self, info: MemoryInfo) -> None:
        if info.writable:
            self._readonly.discard((info.addr, info.length))
        else:
            self._readonly.add((info.addr, info.length))

    def _check_destination(self, job: TransferJob) -> None:
        """A job may not write into memory registered read-only here (e.g. a bytes object)."""
        dest = job.remote if job.op is TransferOp.WRITE else job.local
        own = dest.owner == self.name and dest.kind is not MemKind.FILE
        if own and (dest.addr, dest.length) in self._readonly:
            raise InvalidTransfer(f"destination region at {dest.addr:#x} is read-only")

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"{type(self).__name__} is closed")

    def _new_id(self) -> int:
        self._check_open()
        job_id = self._next_id
        self._next_id += 1
        return job_id

    def _poll(self) -> list[TransferResult]:
        raise NotImplementedError

    def _collect(self) -> None:
        for result in self._poll():
            self._done[result.job_id] = result

    def get_finished(self) -> list[TransferResult]:
        """Every job finished since the last call, in job-id order."""
        self._collect()
        results = [self._done[k] for k in sorted(self._done)]
        self._done.clear()
        return results

    def wait(self, job_id: int, timeout_s: float = 30.0) -> TransferResult:
        """Block until ``job_id`` finishes and take its result (others stay queued)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._collect()
            if job_id in self._done:
                return self._done.pop(job_id)
            if time.monotonic() > deadline:
                raise TransferTimeout(f"job {job_id} not finished after {timeout_s} s")
            time.sleep(0)
