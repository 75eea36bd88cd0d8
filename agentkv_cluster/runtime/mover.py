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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from agentkv_cluster.runtime.handles import ActorGone, ActorSlow
from store.buffers import aligned_buffer
from store.transport.base import (
    Region,
    TransferJob,
    TransferOp,
    TransferStatus,
    TransferTimeout,
)


class MoveError(Exception):
    """A transfer failed or a staging slot could not be had; nothing was committed."""


class StagingFull(MoveError):
    """Every staging slot is in use."""


class TransferStalled(ActorSlow, MoveError):
    """A transfer did not end within TRANSFER_WAIT_S: NIXL may still move its bytes, so the
    memory at both ends is treated as lent to a call that went unanswered (held past its
    lease, ``Mover.staged`` and ``ArenaPages``). It crosses actors as an ``ActorSlow``."""


class SpanExpired(MoveError):
    """The span's lease ended before the transfer started: its owner stopped waiting for
    the call that carried it and may give the memory to another request."""


# How long memory lent under a lease stays out of use once the lease ends with its call
# unanswered (``Mover.hold_slot``, ``ArenaPages``): a transfer started just before
# the lease ended may still run (a transfer's wait is TRANSFER_WAIT_S), plus the clock
# difference between two nodes (leases are wall-clock times, checked by the peer).
TRANSFER_WAIT_S = 60.0
LEASE_GRACE_S = TRANSFER_WAIT_S + 30.0


def unanswered(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` may still move bytes through memory it was lent:
    its actor did not answer, or cannot be reached, or is dead while an actor it asked
    may not be (``ActorGone``; ``ActorSlow`` and ``TransferStalled`` among them)."""
    return isinstance(exc, ActorGone)


def stalled(exc: BaseException) -> bool:
    """Whether ``exc`` is a transfer of this process that may still run."""
    return isinstance(exc, TransferStalled)


def lease_end(lease_s: float | None) -> float:
    """The wall-clock end of a lease of ``lease_s`` seconds from now (0.0: no lease)."""
    return 0.0 if lease_s is None else time.time() + lease_s


T = TypeVar("T")


class Held(Generic[T]):
    """Memory kept out of use until ``LEASE_GRACE_S`` past the lease it was lent under
    (staging slots, arena pages). Not locked: its owner's lock guards it."""

    def __init__(self) -> None:
        self._until: list[tuple[float, T]] = []

    def add(self, item: T, expires: float) -> None:
        """Hold ``item`` until LEASE_GRACE_S past ``expires`` (``lease_end``; 0.0: from now)."""
        self._until.append(((expires or time.time()) + LEASE_GRACE_S, item))

    def due(self) -> list[T]:
        """Take out the items whose time is up."""
        now = time.time()
        out = [item for until, item in self._until if until <= now]
        if out:
            self._until = [held for held in self._until if held[0] > now]
        return out

    def __len__(self) -> int:
        return len(self._until)

    def __iter__(self) -> Iterator[T]:
        return (item for _, item in self._until)


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
    # The lease: a wall-clock time (``time.time()``) after which no transfer may start on
    # the span (0.0: none). The owner lends memory to a call it waits for; once the call
    # goes unanswered (``ActorSlow``) the owner reuses the memory only LEASE_GRACE_S after
    # this, so a peer that wakes up late cannot read or write another request's bytes.
    expires: float = 0.0

    def wire(self) -> tuple[str, bytes, bytes, int, int, float]:
        """Plain values only: Ray ships these without pickling (hot-path calls)."""
        return (self.endpoint.agent, self.endpoint.metadata, self.region, self.offset,
                self.length, self.expires)

    @classmethod
    def from_wire(cls, wire: tuple | list) -> RemoteSpan:
        agent, metadata, region, offset, length, *lease = wire
        return cls(endpoint=Endpoint(agent=agent, metadata=metadata), region=region,
                   offset=offset, length=length, expires=float(lease[0]) if lease else 0.0)

    def part(self, start: int, length: int) -> RemoteSpan:
        """``length`` bytes of this span from ``start``, under the same lease."""
        if start < 0 or start + length > self.length:
            raise MoveError(f"bytes {start}..{start + length} are outside a span of "
                            f"{self.length}")
        return RemoteSpan(endpoint=self.endpoint, region=self.region,
                          offset=self.offset + start, length=length, expires=self.expires)


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
        self._held: Held[int] = Held()  # slots: see ``hold_slot``
        self._lock = threading.Lock()
        self._slot_ready = threading.Condition(self._lock)
        self._taking = threading.Lock()  # ``staged``: one caller takes its slots at a time
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
        deadline = time.monotonic() + timeout_s
        with self._slot_ready:
            while not self._reclaim():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StagingFull(f"{self.transport.name}: no staging slot free")
                self._slot_ready.wait(min(left, 1.0))  # held slots come back by the clock
            return self._free.pop()

    @contextlib.contextmanager
    def staged(self, n: int, expires: float,
               held_on: Callable[[BaseException], bool] = lambda _exc: False,
               timeout_s: float = 10.0) -> Iterator[Staged]:
        """``n`` staging slots, taken all at once (callers that take several never hold
        some while waiting for more), their spans lent until ``expires``. They are given
        back on exit (those taken before one timed out, too); when the body raised an
        error ``held_on`` accepts (a call it lent them to went unanswered, so a peer may
        still move bytes through them), they are held out of use past the lease
        (``hold_slot``)."""
        staged = Staged(self, expires)
        held = False
        try:
            with self._taking:
                for _ in range(n):
                    staged.slots.append(self.take_slot(timeout_s))
            yield staged
        except BaseException as exc:
            held = held_on(exc)
            raise
        finally:
            for slot in staged.slots:
                if held:
                    self.hold_slot(slot, expires)
                else:
                    self.give_slot(slot)

    def give_slot(self, slot: int) -> None:
        with self._slot_ready:
            self._free.append(slot)
            self._slot_ready.notify()

    def hold_slot(self, slot: int, expires: float) -> None:
        """Keep ``slot`` out of use until LEASE_GRACE_S after ``expires`` (the lease of the
        spans of it lent to a call that went unanswered: the peer may still move bytes
        through them); it comes back zeroed. Without a lease, from now."""
        with self._slot_ready:
            self._held.add(slot, expires)

    def held_slots(self) -> int:
        with self._slot_ready:
            return len(self._held)

    def _reclaim(self) -> bool:
        """Free the held slots whose time is up (zeroed: they may hold a late peer's
        bytes); whether a slot is free. The caller holds the lock."""
        for slot in self._held.due():
            self.slot_view(slot)[:] = 0
            self._free.append(slot)
        return bool(self._free)

    def scrub_free(self) -> int:
        """Zero every free staging slot (erasure: a slot keeps the plaintext of the last
        page staged in it); returns how many were zeroed. Held slots are zeroed when they
        come back, not now: a late peer may still read one, and would seal the zeroes as
        the page it was moving (another tenant's, maybe)."""
        with self._slot_ready:
            for slot in self._free:
                self.slot_view(slot)[:] = 0
            return len(self._free)

    def slot_view(self, slot: int, length: int | None = None) -> np.ndarray:
        start = slot * self.slot_bytes
        return self.staging[start:start + (self.slot_bytes if length is None else length)]

    def slot_span(self, slot: int, length: int, expires: float = 0.0) -> RemoteSpan:
        """The span a peer uses to read from or write into one of our staging slots, lent
        until ``expires`` (``lease_end``; 0.0: no lease)."""
        if length > self.slot_bytes:
            raise MoveError(f"{length} bytes exceed a staging slot of {self.slot_bytes}")
        return RemoteSpan(endpoint=self.endpoint(), region=self.staging_region.pack(),
                          offset=slot * self.slot_bytes, length=length, expires=expires)

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
        if span.expires and time.time() > span.expires:
            raise SpanExpired(f"the lease on {span.length} B of {span.endpoint.agent} ended "
                              f"{time.time() - span.expires:.1f} s ago")
        self._peer(span.endpoint)
        return self.transport.submit(TransferJob(
            op=op, local=local, remote=Region.unpack(span.region), length=span.length,
            local_offset=local_offset, remote_offset=span.offset))

    def _move(self, op: TransferOp, local: Region, local_offset: int, span: RemoteSpan) -> int:
        with self._xfer:
            job_id = self._submit(op, local, local_offset, span)
            try:
                result = self.transport.wait(job_id, timeout_s=TRANSFER_WAIT_S)
            except TransferTimeout as exc:
                raise TransferStalled(f"{op.value} of {span.length} B: {exc}") from None
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
        ended (none still writes into a buffer its caller frees on the error), or
        ``TransferStalled`` when one did not end (its buffers must be held, not freed)."""
        moved, failed, stalled = 0, "", 0
        with self._xfer:
            for job_id in job_ids:
                try:
                    result = self.transport.wait(job_id, timeout_s=TRANSFER_WAIT_S)
                except TransferTimeout:
                    stalled += 1
                    continue
                if result.status is TransferStatus.DONE:
                    moved += result.nbytes
                elif not failed:
                    failed = result.error or result.status.name
        self.bytes_moved += moved
        if stalled:
            raise TransferStalled(f"{stalled} of {len(job_ids)} WRITEs did not end in "
                                  f"{TRANSFER_WAIT_S:.0f} s")
        if failed:
            raise MoveError(f"WRITE failed: {failed}")
        return moved

    def drain(self, job_ids: list[int]) -> None:
        """Wait for every job to end, failed or not (an error path freeing its buffers)."""
        with self._xfer:
            for job_id in job_ids:
                with contextlib.suppress(Exception):  # already failing: the caller's error wins
                    self.transport.wait(job_id, timeout_s=TRANSFER_WAIT_S)

    def pull(self, span: RemoteSpan, local: Region, local_offset: int = 0) -> int:
        """Copy a peer's span into our registered ``local`` region (NIXL READ)."""
        return self._move(TransferOp.READ, local, local_offset, span)

    def push(self, local: Region, local_offset: int, span: RemoteSpan) -> int:
        """Copy from our registered ``local`` region into a peer's span (NIXL WRITE)."""
        return self._move(TransferOp.WRITE, local, local_offset, span)

    def close(self) -> None:
        self.transport.close()


@dataclass(slots=True)
class Staged:
    """Staging slots taken together for one call, and the lease of their spans."""

    mover: Mover
    expires: float  # ``lease_end`` of the call the slots are lent to
    slots: list[int] = field(default_factory=list)

    def span(self, i: int, length: int) -> RemoteSpan:
        """The span of ``length`` bytes of the ``i``-th slot, under the lease."""
        return self.mover.slot_span(self.slots[i], length, self.expires)
