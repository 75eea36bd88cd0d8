"""Byte movement between service processes: NIXL UCX agents plus registered staging slots.

Every process that moves page bytes (API front, HBM actors, pool actors) owns one
``Mover``: a ``NixlUcxTransport`` and a preallocated, pre-faulted staging buffer cut
into fixed slots. Peers are named by an ``Endpoint`` (agent name + metadata bytes)
that Ray carries as a plain value; the page bytes themselves travel only by NIXL
(shared memory / CMA on one node, the network between nodes), never through the
Ray object store.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import numpy as np

from store.buffers import aligned_buffer
from store.transport.base import Region, TransferJob, TransferOp, TransferStatus


class MoveError(Exception):
    """A transfer failed or a staging slot could not be had; nothing was committed."""


class StagingFull(MoveError):
    """Every staging slot is in use."""


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """How a peer reaches this process's registered memory."""

    agent: str
    metadata: bytes


@dataclass(frozen=True, kw_only=True)
class RemoteSpan:
    """A byte range in a peer's registered memory."""

    endpoint: Endpoint
    region: bytes  # Region.pack()
    offset: int
    length: int

    def wire(self) -> tuple[str, bytes, bytes, int, int]:
        """Plain values only: Ray ships these without pickling (hot-path calls)."""
        return (self.endpoint.agent, self.endpoint.metadata, self.region, self.offset,
                self.length)

    @classmethod
    def from_wire(cls, wire: tuple | list) -> RemoteSpan:
        agent, metadata, region, offset, length = wire
        return cls(endpoint=Endpoint(agent=agent, metadata=metadata), region=region,
                   offset=offset, length=length)


class Mover:
    """One NIXL agent, one staging area of ``num_slots`` x ``slot_bytes``."""

    def __init__(self, name: str, slot_bytes: int, num_slots: int) -> None:
        from store.transport.nixl_ucx import NixlUcxTransport

        # One lane unless the operator asks for more (AGENTKV_NIXL_LANES): the service keeps
        # several moves in flight per link, which already use the cores; splitting each one
        # as well only added threads (bench_service, 16 MiB restores, 4 in flight: actors
        # 1.36-1.43 GB/s with two lanes vs 1.63-1.66 with one, alternated, load 1.6-2.1).
        lanes = None if os.environ.get("AGENTKV_NIXL_LANES") else 1
        self.transport = NixlUcxTransport(name, lanes=lanes)
        self.slot_bytes = slot_bytes
        self.staging = aligned_buffer(slot_bytes * num_slots)
        self._endpoint: Endpoint | None = None
        self.staging_region = self.transport.register(self.staging)
        self._free = list(range(num_slots - 1, -1, -1))
        self._lock = threading.Lock()
        self._slot_ready = threading.Condition(self._lock)
        self._peers: set[str] = set()
        self._xfer = threading.Lock()  # the NIXL transport is driven by one thread at a time
        self.bytes_moved = 0

    def register(self, buffer: object) -> Region:
        """Register more memory (an HBM arena) that peers may address."""
        self._endpoint = None  # the agent metadata changes with every registration
        return self.transport.register(buffer)

    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            self._endpoint = Endpoint(agent=self.transport.name,
                                      metadata=self.transport.agent_metadata())
        return self._endpoint

    # -- staging slots ----------------------------------------------------------------
    def take_slot(self, timeout_s: float = 10.0) -> int:
        with self._slot_ready:
            if not self._slot_ready.wait_for(lambda: bool(self._free), timeout_s):
                raise StagingFull(f"{self.transport.name}: no staging slot free")
            return self._free.pop()

    def give_slot(self, slot: int) -> None:
        with self._slot_ready:
            self._free.append(slot)
            self._slot_ready.notify()

    def scrub_free(self) -> int:
        """Zero every staging slot not in use (erasure: a slot keeps the plaintext of the
        last page staged in it); returns how many were zeroed."""
        with self._slot_ready:
            for slot in self._free:
                self.slot_view(slot)[:] = 0
            return len(self._free)

    def slot_view(self, slot: int, length: int | None = None) -> np.ndarray:
        start = slot * self.slot_bytes
        return self.staging[start:start + (self.slot_bytes if length is None else length)]

    def slot_span(self, slot: int, length: int) -> RemoteSpan:
        """The span a peer uses to read from or write into one of our staging slots."""
        if length > self.slot_bytes:
            raise MoveError(f"{length} bytes exceed a staging slot of {self.slot_bytes}")
        return RemoteSpan(endpoint=self.endpoint(), region=self.staging_region.pack(),
                          offset=slot * self.slot_bytes, length=length)

    # -- transfers ----------------------------------------------------------------------
    def introduce(self, endpoint: Endpoint) -> None:
        """Learn a peer. UCX wires a connection up from both ends, so the target of a
        transfer must know its initiator too: wiring introduces every pair both ways."""
        with self._xfer:
            self._peer(endpoint)

    def knows(self, agent: str) -> bool:
        """Whether ``agent`` was introduced (transfers with it can be wired up)."""
        with self._xfer:
            return agent in self._peers

    def _peer(self, endpoint: Endpoint) -> None:
        if endpoint.agent == self.transport.name or endpoint.agent in self._peers:
            return
        self.transport.add_peer(endpoint.metadata)
        self._peers.add(endpoint.agent)

    def _submit(self, op: TransferOp, local: Region, local_offset: int, span: RemoteSpan
                ) -> int:
        """Start one transfer of ``span``; the caller holds ``_xfer``."""
        self._peer(span.endpoint)
        return self.transport.submit(TransferJob(
            op=op, local=local, remote=Region.unpack(span.region), length=span.length,
            local_offset=local_offset, remote_offset=span.offset))

    def _move(self, op: TransferOp, local: Region, local_offset: int, span: RemoteSpan) -> int:
        with self._xfer:
            result = self.transport.wait(self._submit(op, local, local_offset, span),
                                         timeout_s=60.0)
        if result.status is not TransferStatus.DONE:
            raise MoveError(f"{op.value} of {span.length} B failed: {result.error}")
        self.bytes_moved += span.length
        return span.length

    def push_async(self, local: Region, local_offset: int, span: RemoteSpan) -> int:
        """Start a NIXL WRITE and return its job id (``wait_all`` collects it)."""
        with self._xfer:
            return self._submit(TransferOp.WRITE, local, local_offset, span)

    def wait_all(self, job_ids: list[int]) -> int:
        """Wait for every job; raises ``MoveError`` for the first that failed, once all
        ended (none still writes into a buffer its caller frees on the error)."""
        moved, failed = 0, ""
        with self._xfer:
            for job_id in job_ids:
                result = self.transport.wait(job_id, timeout_s=60.0)
                if result.status is TransferStatus.DONE:
                    moved += result.nbytes
                elif not failed:
                    failed = result.error or result.status.name
        self.bytes_moved += moved
        if failed:
            raise MoveError(f"WRITE failed: {failed}")
        return moved

    def drain(self, job_ids: list[int]) -> None:
        """Wait for every job to end, failed or not (an error path freeing its buffers)."""
        with self._xfer:
            for job_id in job_ids:
                with contextlib.suppress(Exception):  # already failing: the caller's error wins
                    self.transport.wait(job_id, timeout_s=60.0)

    def pull(self, span: RemoteSpan, local: Region, local_offset: int = 0) -> int:
        """Copy a peer's span into our registered ``local`` region (NIXL READ)."""
        return self._move(TransferOp.READ, local, local_offset, span)

    def push(self, local: Region, local_offset: int, span: RemoteSpan) -> int:
        """Copy from our registered ``local`` region into a peer's span (NIXL WRITE)."""
        return self._move(TransferOp.WRITE, local, local_offset, span)

    def close(self) -> None:
        self.transport.close()
