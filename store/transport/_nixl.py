"""The one place that imports NIXL, and the job plumbing both NIXL transports share."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

from store.parallel import THREADS, fan_out
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


def _select_ucx_thread_lock(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Have UCX guard its workers with a mutex rather than a spinlock.

    Every agent runs NIXL's progress thread beside the threads that submit and wait. A
    same-host UCX copy (CMA) runs on the thread that holds the worker's lock, for
    milliseconds per large page; with UCX's default spinlock the other thread spins on a
    core for that whole time. On the 2-core machine that was a quarter of the pool actor's
    CPU during a stream of 16 MiB restores (``pthread_spin_lock`` under ``perf``), taken
    from the AES-GCM opens and the copies themselves. With ``UCX_USE_MT_MUTEX=y`` the
    waiting thread sleeps (docs/architecture.md has the measurements). An operator's own
    ``UCX_USE_MT_MUTEX`` always wins. Returns what was set."""
    if "UCX_USE_MT_MUTEX" in environ:
        return None
    environ["UCX_USE_MT_MUTEX"] = "y"
    return environ["UCX_USE_MT_MUTEX"]


# Before the bindings load: UCX reads its configuration when the first agent starts.
_select_ucx_modules()
_select_ucx_thread_lock()

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

# Lanes: one UCX copy (CMA, between processes of one host) runs on the thread that submits
# it, at about one core's memcpy speed. A large job is split across ``lanes`` agents (each
# its own UCX worker) and the parts start on as many threads; on the 2-core machine two
# lanes moved 16 MiB at 16.8-17.4 GB/s p10 against 10.4-10.8 for one (quiet, interleaved).
# The extra agents are made on the first job that splits, so processes that only move
# small pages never run their progress threads.
LANE_FROM = 4 << 20
LANE_MIN = 1 << 20  # no part smaller than this


def _default_lanes() -> int:
    env = os.environ.get("AGENTKV_NIXL_LANES")
    return max(1, int(env)) if env else min(4, THREADS)

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
    # Whether large jobs split across lanes (see LANE_FROM); file jobs do not.
    lanes_allowed = False

    def __init__(self, name: str | None = None, lanes: int | None = None) -> None:
        super().__init__()
        self.name = name or f"{self.backend.lower()}-{uuid.uuid4().hex[:12]}"
        self._agent = self._make_agent(self.name)
        self._agents = [self._agent]  # lane 0 first; the others once a job splits
        self.lanes = max(1, _default_lanes() if lanes is None else lanes) \
            if self.lanes_allowed else 1
        self._peers: set[str] = {self.name}
        self._peer_meta: dict[str, bytes] = {}  # for lanes added later
        # registration key -> (buffer, its registration with each lane's agent)
        self._regs: dict[tuple[MemKind, int, int, int], tuple[Any, list[Any]]] = {}
        self._pending: dict[int, tuple[list[_Part], int]] = {}  # job id -> (parts, length)
        self._early: list[TransferResult] = []  # finished inside submit()

    def _make_agent(self, name: str) -> Any:
        config = nixl.nixl_agent_config(
            enable_prog_thread=self.progress_thread, backends=[self.backend]
        )
        agent = _new_agent(name, config)
        if self.backend not in agent.backends:
            raise RuntimeError(f"NIXL backend {self.backend} did not load")
        return agent

    @property
    def lanes_in_use(self) -> int:
        """How many lanes' agents run now (the first, plus the others once a job split)."""
        return len(self._agents)

    def _add_lanes(self) -> None:
        """Make the other lanes' agents: each registers this transport's memory and learns
        its peers. A lane that fails to start leaves the transport with fewer lanes."""
        while len(self._agents) < self.lanes:
            try:
                agent = self._make_agent(f"{self.name}~{len(self._agents)}")
            except (RuntimeError, *NIXL_ERRORS):
                self.lanes = len(self._agents)
                return
            try:
                for key, (_buffer, regs) in self._regs.items():
                    if key[0] is not MemKind.FILE:
                        regs.append(_register_with(agent, key))
                for meta in self._peer_meta.values():
                    agent.add_remote_agent(meta)
            except NIXL_ERRORS:
                for _buffer, regs in self._regs.values():
                    if len(regs) > len(self._agents):
                        agent.deregister_memory(regs.pop())
                self.lanes = len(self._agents)
                return
            self._agents.append(agent)

    def register(self, buffer: Any) -> Region:
        self._check_open()
        if isinstance(buffer, FileSpan):
            if buffer.length <= 0:
                raise InvalidTransfer("file span length must be positive")
            region = Region(
                kind=MemKind.FILE, addr=0, length=buffer.length, device=buffer.fd, owner=self.name
            )
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
        key = _reg_key(region)
        agents = self._agents if region.kind is not MemKind.FILE else self._agents[:1]
        self._regs[key] = (buffer, [_register_with(a, key) for a in agents])
        return region

    def deregister(self, region: Region) -> None:
        entry = self._regs.pop(_reg_key(region), None)
        if entry is not None:
            for agent, reg in zip(self._agents, entry[1], strict=False):
                agent.deregister_memory(reg)

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
        spans = split_job(job.length, self.lanes, bool(job.tag))
        if len(spans) > len(self._agents):  # the other lanes start on the first split
            self._add_lanes()
            spans = split_job(job.length, self.lanes, bool(job.tag))
        parts: list[_Part] = []
        try:
            for agent, (offset, length) in zip(self._agents[:len(spans)], spans, strict=True):
                parts.append(_Part(agent, self._prepare(agent, job, offset, length)))
        except NIXL_ERRORS as exc:
            for part in parts:
                part.release()
            raise InvalidTransfer(f"NIXL refused the job: {exc!r}") from exc
        job_id = self._new_id()

        def start(i: int) -> None:
            part = parts[i]
            part.state = self._state(lambda: part.agent.transfer(part.handle))

        fan_out(len(parts), start, threads=len(parts))  # each part's copy on its own thread
        if any(part.state == "PROC" for part in parts):
            self._pending[job_id] = (parts, job.length)
        else:
            self._early.append(self._finish(job_id, parts, job.length))
        return job_id

    @staticmethod
    def _prepare(agent: Any, job: TransferJob, offset: int, length: int) -> Any:
        local = agent.get_xfer_descs(
            [(job.local.addr + job.local_offset + offset, length, job.local.device)],
            job.local.kind.value,
        )
        remote = agent.get_xfer_descs(
            [(job.remote.addr + job.remote_offset + offset, length, job.remote.device)],
            job.remote.kind.value,
        )
        return agent.initialize_xfer(job.op.value, local, remote, job.remote.owner,
                                     notif_msg=job.tag)

    @staticmethod
    def _state(call: Any) -> str:
        """ "DONE", "PROC" or an error state; a backend error (short I/O, full disk) is a state."""
        try:
            return call()
        except NIXL_ERRORS as exc:
            return f"ERR ({type(exc).__name__})"

    def _finish(self, job_id: int, parts: list[_Part], length: int) -> TransferResult:
        for part in parts:
            part.release()
        failed = [part.state for part in parts if part.state != "DONE"]
        if not failed:
            return TransferResult(job_id, TransferStatus.DONE, length)
        return TransferResult(
            job_id, TransferStatus.FAILED, 0, f"NIXL {self.backend} state {failed[0]}"
        )

    def _poll(self) -> list[TransferResult]:
        finished, self._early = self._early, []
        for job_id, (parts, length) in list(self._pending.items()):
            for part in parts:
                if part.state == "PROC":
                    part.state = self._state(lambda p=part: p.agent.check_xfer_state(p.handle))
            if all(part.state != "PROC" for part in parts):
                del self._pending[job_id]
                finished.append(self._finish(job_id, parts, length))
        return finished

    def close(self) -> None:
        if self._closed:
            return
        # Let in-flight jobs land before their memory is deregistered; a peer that died
        # mid-transfer must not hang close(), so give up after a while.
        deadline = time.monotonic() + _CLOSE_GRACE_S
        while self._pending and time.monotonic() < deadline:
            self._collect()
        for parts, _length in self._pending.values():
            for part in parts:
                part.release()  # an unfinished request may refuse; the agent reaps it
        self._pending.clear()
        for _buffer, regs in self._regs.values():
            for agent, reg in zip(self._agents, regs, strict=False):
                agent.deregister_memory(reg)
        self._regs.clear()
        self._closed = True


def split_job(length: int, lanes: int, tagged: bool) -> list[tuple[int, int]]:
    """(offset, length) of each part of a job: one per lane, page aligned and at least
    ``LANE_MIN`` each, for an untagged job of ``LANE_FROM`` bytes or more; else the whole
    job (a tag is one notification, sent when the whole job has landed)."""
    n = min(lanes, length // LANE_MIN)
    if tagged or length < LANE_FROM or n < 2:
        return [(0, length)]
    step = -(-length // n)
    step = -(-step // 4096) * 4096
    return [(lo, min(step, length - lo)) for lo in range(0, length, step)]


class _Part:
    """One lane's share of a job: its agent, transfer handle and last state."""

    __slots__ = ("agent", "handle", "state")

    def __init__(self, agent: Any, handle: Any) -> None:
        self.agent, self.handle, self.state = agent, handle, "PROC"

    def release(self) -> None:
        try:
            self.handle.release()
        except NIXL_ERRORS:
            pass  # a failed request may refuse release; the agent frees it on teardown


def _reg_key(region: Region) -> tuple[MemKind, int, int, int]:
    return (region.kind, region.addr, region.length, region.device)


def _register_with(agent: Any, key: tuple[MemKind, int, int, int]) -> Any:
    """Register the memory (or file: address 0, device = fd) a registration key names."""
    kind, addr, length, device = key
    return agent.register_memory([(addr, length, device, "")], kind.value)
