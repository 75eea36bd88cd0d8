"""Reservations of the keyed store (``store.kv``): ``Reservation``, the room for one value a
producer fills before it is published, and ``ReservationLedger``, the store's account of
those it has out.

The ledger lends the store's one spare buffer to one reservation at a time (another one in
flight gets its own, so none overwrites another's bytes), finishes each reservation once
(``ReservationClosed`` after that, or for another store's), and watches each one handed to
a caller: one dropped unfinished is garbage-collected, and its finalizer only queues what
it held. The store gives that back at its next call, under its own lock, so a collection
that happens in the middle of a store call never changes the pool under it. A slot queued
so is the dropped reservation's alone: a reservation is finished only through the ledger,
which detaches its finalizer, and nothing else frees a reserved slot before ``close``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

import numpy as np

from store.buffers import aligned_buffer
from store.kv_types import ReservationClosed
from store.types import Tier

__all__ = ["Reservation", "ReservationLedger", "finished"]


@dataclass(slots=True, weakref_slot=True)
class Reservation:
    """Room for one value (``KVStore.reserve``): committed or aborted once, after which its
    buffer is no longer the caller's. As a context manager it commits on a clean exit and
    aborts on an exception (one finished inside the block is left alone); one dropped
    unfinished gives its slot back once it is garbage-collected."""

    key: bytes
    nbytes: int
    tier: Tier
    buffer: np.ndarray  # write the value here, then ``commit``
    slot: int = -1  # host slot, or -1 (NVMe, or an empty value)
    target: np.ndarray | None = None  # sealed: the reserved slot the record is sealed into
    owner: Any = field(default=None, repr=False, compare=False)  # the store; None: done
    lent: bool = field(default=False, repr=False)  # ``buffer`` is the store's spare one
    staged: bool = field(default=False, repr=False)  # ``buffer`` is a staging buffer (``lend``)
    in_place: bool = field(default=False, repr=False)  # ``slot`` held the key's old value
    reaper: weakref.finalize | None = field(default=None, repr=False, compare=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.owner is None:
            return  # committed or aborted inside the block
        if kind is None:
            self.owner.commit(self)
        else:
            self.owner.abort(self)


def finished(r: Reservation) -> bool:
    """Whether ``r`` was committed or aborted; ``TypeError`` if it is no ``Reservation``."""
    if not isinstance(r, Reservation):
        raise TypeError(f"expected a Reservation from KVStore.reserve, got {r!r:.40}")
    return r.owner is None


class _Dropped(NamedTuple):
    slot: int  # the host slot it held, or -1
    lent: bool  # it held the spare buffer
    nbytes: int  # of it


class ReservationLedger:
    """One store's reservations in flight (see the module doc); the caller holds the
    store's lock around every method."""

    def __init__(self, spare: np.ndarray | None) -> None:
        self._spare = spare
        self._spare_lent = False
        self._dropped: deque[_Dropped] = deque()  # appended to by finalizers, on any thread

    def lend(self, r: Reservation) -> None:
        """Give ``r`` a staging buffer: the spare one if it is free, else its own."""
        if self._spare_lent or self._spare is None:
            r.buffer = aligned_buffer(r.nbytes)
        else:
            r.buffer, r.lent, self._spare_lent = self._spare[:r.nbytes], True, True
        r.staged = True

    def watch(self, r: Reservation) -> None:
        """Queue what ``r`` holds for ``dropped`` if it is garbage-collected unfinished."""
        r.reaper = weakref.finalize(r, self._dropped.append,
                                    _Dropped(r.slot, r.lent, r.nbytes))
        r.reaper.atexit = False

    def settle(self, r: Reservation, store: object) -> None:
        """Finish ``r`` (it is ``store``'s and was not finished before, else
        ``ReservationClosed``)."""
        if finished(r) or r.owner is not store:
            raise ReservationClosed(f"{r.key!r:.40}: committed or aborted already"
                                    if r.owner is None else "another store's reservation")
        r.owner = None
        if r.reaper is not None:
            r.reaper.detach()  # finished: nothing for the finalizer to give back

    @contextlib.contextmanager
    def settled(self, r: Reservation, store: object) -> Iterator[None]:
        """``settle`` ``r``, then ``wipe`` it once the block has sealed or given it up."""
        self.settle(r, store)
        try:
            yield
        finally:
            self.wipe(r)

    def wipe(self, r: Reservation) -> None:
        """After a settled ``r`` was sealed or given up: zero the staging buffer it was
        lent (a sealed store's plaintext must not stay in memory, nor be the next
        reservation's first bytes; one memset, small beside sealing the value) and take the
        spare back. A buffer that is a host slot is the value itself: left alone."""
        if r.staged:
            r.buffer[:] = 0
            r.staged = False
        if r.lent:
            self._spare_lent = r.lent = False

    def dropped(self) -> list[int]:
        """The host slots of reservations dropped unfinished since the last call (the
        spare buffer they held is free again)."""
        slots = []
        while self._dropped:
            gone = self._dropped.popleft()
            if gone.slot >= 0:
                slots.append(gone.slot)
            if gone.lent:
                self._spare[:gone.nbytes] = 0  # the dropped one's plaintext
                self._spare_lent = False
        return slots

    def clear(self) -> None:
        """The store closed: nothing is given back any more (and no plaintext stays)."""
        self._dropped.clear()
        if self._spare is not None:
            self._spare[:] = 0
