"""The one place that imports NIXL, and the job plumbing both NIXL transports share."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

from store.transport.base import (
    FileSpan,
    InvalidTransfer,
    JobBook,
    MemKind,
    Region,
    TransferJob,
    TransferResult,
    TransferStatus,
    UnknownPeer,
    memory_address,
)


def _select_ucx_modules(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Keep UCX from loading its InfiniBand modules on a host without RDMA devices.

    The NIXL wheel bundles its own libibverbs and libnl (hashed names). UCX loads its
    ``ib`` modules at context start whether or not the host has an RDMA device; one of
    them (``uct_ib_efa``) needs ``libefa.so.1``, which only the host's rdma-core provides,
    and that pulls in the host's libibverbs and libnl-route as well. Two copies of
    libnl-route then register the same traffic-control ops; the second registration is
    refused and leaves its ops unlinked, and at exit that copy's destructor unlinks them
    anyway: a segmentation fault in ``rtnl_tc_unregister`` after the program has finished
    (every process that started a NIXL UCX agent on a host with rdma-core installed).

    Without an RDMA device the ``ib`` modules can carry nothing, so they are not loaded
    (``UCX_MODULES=^ib``): no second libibverbs, no second libnl. CUDA and shared-memory
    modules are unaffected. An operator's own ``UCX_MODULES`` always wins; on hosts with
    RDMA devices UCX keeps its default (see docs/architecture.md). Returns what was set."""
    if "UCX_MODULES" in environ or _has_rdma_device():
        return None
    environ["UCX_MODULES"] = "^ib"
    return environ["UCX_MODULES"]


def _has_rdma_device(sysfs: str = "/sys/class/infiniband") -> bool:
    try:
        return any(True for _ in os.scandir(sysfs))
    except OSError:
        return False


# Before the bindings load: UCX reads its configuration when the first agent starts.
_select_ucx_modules()

try:
    import nixl  # type: ignore[import-not-found]
except ImportError:
    import nixl_cu12 as nixl  # type: ignore[import-not-found,no-redef]

import sys

# The bindings module behind either package name holds the error classes.
_nixl_bind = sys.modules[nixl.nixl_agent.__module__].nixlBind

# NIXL's Python layer logs every agent start at INFO on stdout; keep stdout for our output.
if "NIXL_LOG_LEVEL" not in os.environ:
    logging.getLogger("nixl").setLevel(logging.WARNING)

# Every error class the bindings raise; caught at our boundary and turned into ours.
NIXL_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(_nixl_bind, n) for n in dir(_nixl_bind) if n.startswith("nixl") and n.endswith("Error")
)


_CLOSE_GRACE_S = 10.0

# nixl_agent starts its progress thread with pthrDelay = 0: it polls without pause and
# keeps a whole core busy per agent (three agents on a 2-core node starve every actor).
# With a delay the idle thread sleeps between polls; a transfer waits at most this long.
PROGRESS_DELAY_US = int(os.environ.get("AGENTKV_NIXL_PROGRESS_US", "100"))
_AGENT_CONFIG = _nixl_bind.nixlAgentConfig


class _PacedAgentConfig(_AGENT_CONFIG):  # type: ignore[misc, valid-type]
    """The bindings' agent config, with ``pthrDelay`` held at ``PROGRESS_DELAY_US``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "pthrDelay":
            value = max(0, PROGRESS_DELAY_US)
        super().__setattr__(name, value)


_AGENT_LOCK = threading.Lock()


def _new_agent(name: str, config: Any) -> Any:
    """A ``nixl_agent`` whose progress thread sleeps ``PROGRESS_DELAY_US`` when idle.

    ``nixl_agent_config`` exposes no delay, so the bindings' config class is swapped for
    the paced one while the agent is built (under a lock; restored at once)."""
    with _AGENT_LOCK:
        _nixl_bind.nixlAgentConfig = _PacedAgentConfig
        try:
            return nixl.nixl_agent(name, config)
        finally:
            _nixl_bind.nixlAgentConfig = _AGENT_CONFIG


class NixlTransportBase(JobBook):
    """A NIXL agent with one backend; subclasses choose the backend and allowed kinds."""

    backend = ""
    remote_kinds: frozenset[MemKind] = frozenset()
    # NIXL's progress thread spins on a core. Local file I/O completes under our own polling
    # and does without it; UCX keeps it, because a target that is busy elsewhere must
    # still answer (over TCP, one-sided operations need the target to make progress).
    progress_thread = True

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name or f"{self.backend.lower()}-{uuid.uuid4().hex[:12]}"
        config = nixl.nixl_agent_config(
            enable_prog_thread=self.progress_thread, backends=[self.backend]
        )
        self._agent = _new_agent(self.name, config)
        if self.backend not in self._agent.backends:
            raise RuntimeError(f"NIXL backend {self.backend} did not load")
        self._peers: set[str] = {self.name}
        self._regs: dict[tuple[MemKind, int, int, int], tuple[Any, Any]] = {}
        self._pending: dict[int, tuple[Any, int]] = {}  # job id -> (xfer handle, length)
        self._early: list[TransferResult] = []  # finished inside submit()

    def register(self, buffer: Any) -> Region:
        self._check_open()
        if isinstance(buffer, FileSpan):
            if buffer.length <= 0:
                raise InvalidTransfer("file span length must be positive")
            region = Region(
                kind=MemKind.FILE, addr=0, length=buffer.length, device=buffer.fd, owner=self.name
            )
            reg = self._agent.register_memory([(0, buffer.length, buffer.fd, "")], "FILE")
        else:
            info = memory_address(buffer)
            self._note_memory(info)
            region = Region(
                kind=info.kind,
                addr=info.addr,
                length=info.length,
                device=info.device,
                owner=self.name,
            )
            reg = self._agent.register_memory(
                [(info.addr, info.length, info.device, "")], info.kind.value
            )
        self._regs[_reg_key(region)] = (buffer, reg)
        return region

    def deregister(self, region: Region) -> None:
        entry = self._regs.pop(_reg_key(region), None)
        if entry is not None:
            self._agent.deregister_memory(entry[1])

    def submit(self, job: TransferJob) -> int:
        self._check_open()
        job.validate()
        self._check_destination(job)
        if job.remote.kind not in self.remote_kinds:
            raise InvalidTransfer(f"{self.backend} cannot reach {job.remote.kind.value} regions")
        if job.remote.owner not in self._peers:
            raise UnknownPeer(f"{self.name} was not introduced to {job.remote.owner!r}")
        if _reg_key(job.local) not in self._regs:
            raise InvalidTransfer(f"local region at {job.local.addr:#x} is not registered")
        local = self._agent.get_xfer_descs(
            [(job.local.addr + job.local_offset, job.length, job.local.device)],
            job.local.kind.value,
        )
        remote_addr = job.remote.addr + job.remote_offset
        remote = self._agent.get_xfer_descs(
            [(remote_addr, job.length, job.remote.device)], job.remote.kind.value
        )
        try:
            handle = self._agent.initialize_xfer(
                job.op.value, local, remote, job.remote.owner, notif_msg=job.tag
            )
        except NIXL_ERRORS as exc:
            raise InvalidTransfer(f"NIXL refused the job: {exc!r}") from exc
        job_id = self._new_id()
        state = self._state(lambda: self._agent.transfer(handle))
        if state == "PROC":
            self._pending[job_id] = (handle, job.length)
        else:
            self._early.append(self._finish(job_id, handle, job.length, state))
        return job_id

    @staticmethod
    def _state(call: Any) -> str:
        """ "DONE", "PROC" or an error state; a backend error (short I/O, full disk) is a state."""
        try:
            return call()
        except NIXL_ERRORS as exc:
            return f"ERR ({type(exc).__name__})"

    def _finish(self, job_id: int, handle: Any, length: int, state: str) -> TransferResult:
        try:
            handle.release()
        except NIXL_ERRORS:
            pass  # a failed request may refuse release; the agent frees it on teardown
        if state == "DONE":
            return TransferResult(job_id, TransferStatus.DONE, length)
        return TransferResult(
            job_id, TransferStatus.FAILED, 0, f"NIXL {self.backend} state {state}"
        )

    def _poll(self) -> list[TransferResult]:
        finished, self._early = self._early, []
        for job_id, (handle, length) in list(self._pending.items()):
            state = self._state(lambda h=handle: self._agent.check_xfer_state(h))
            if state != "PROC":
                del self._pending[job_id]
                finished.append(self._finish(job_id, handle, length, state))
        return finished

    def close(self) -> None:
        if self._closed:
            return
        # Let in-flight jobs land before their memory is deregistered; a peer that died
        # mid-transfer must not hang close(), so give up after a while.
        deadline = time.monotonic() + _CLOSE_GRACE_S
        while self._pending and time.monotonic() < deadline:
            self._collect()
        for handle, _length in self._pending.values():
            try:
                handle.release()
            except NIXL_ERRORS:
                pass  # an unfinished request may refuse release; the agent reaps it
        self._pending.clear()
        for _buffer, reg in self._regs.values():
            self._agent.deregister_memory(reg)
        self._regs.clear()
        self._closed = True


def _reg_key(region: Region) -> tuple[MemKind, int, int, int]:
    return (region.kind, region.addr, region.length, region.device)
