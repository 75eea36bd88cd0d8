"""Slab pool: several host-pool segments, one per slot size class, behind one allocator.

Compressed pages vary in size (an INT4 page is ~0.31 of its FULL form), so one
slot size wastes most of each slot. ``alloc(nbytes)`` takes a slot from the
smallest class that fits and still has one free, spilling into larger classes.
Segments are named ``<name>.c<i>`` in /dev/shm, smallest class first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Self

import numpy as np

from store.host_pool import SHM_DIR, HostPool, PageTooLarge, PoolFull, PoolStats, SlotEmpty


@dataclass(frozen=True, kw_only=True)
class SlabClass:
    slot_bytes: int
    num_slots: int


class SlabRef(NamedTuple):
    """Where a page sits: size class and slot. ``packed`` fits a directory location."""

    size_class: int
    slot: int

    @property
    def packed(self) -> int:
        return self.size_class << 32 | self.slot

    @classmethod
    def unpack(cls, packed: int) -> SlabRef:
        return cls(packed >> 32, packed & 0xFFFFFFFF)


@dataclass(frozen=True, kw_only=True)
class SlabStats:
    classes: tuple[PoolStats, ...]

    @property
    def capacity_bytes(self) -> int:
        return sum(c.capacity_bytes for c in self.classes)

    @property
    def used_bytes(self) -> int:
        return sum(c.used_bytes for c in self.classes)

    @property
    def used_slots(self) -> int:
        return sum(c.used_slots for c in self.classes)

    @property
    def fragmentation(self) -> float:
        """Share of allocated slot bytes, over all classes, that hold no page data."""
        held = sum(c.used_slots * c.slot_bytes for c in self.classes)
        return 0.0 if held == 0 else 1.0 - self.used_bytes / held


def _segment(name: str, i: int) -> str:
    return f"{name}.c{i}"


class SlabPool:
    """Use :meth:`create` (writer) or :meth:`attach`. Same roles and guarantees as HostPool."""

    def __init__(self, name: str, pools: Sequence[HostPool]) -> None:
        self.name = name
        self._pools = list(pools)
        self.class_bytes = tuple(p.slot_bytes for p in self._pools)

    @classmethod
    def create(cls, name: str, classes: Sequence[SlabClass]) -> SlabPool:
        if not classes:
            raise ValueError("a slab pool needs at least one size class")
        ordered = sorted(classes, key=lambda c: c.slot_bytes)
        pools: list[HostPool] = []
        try:
            for i, c in enumerate(ordered):
                pools.append(HostPool.create(_segment(name, i), c.slot_bytes, c.num_slots))
        except BaseException:
            for p in pools:
                p.close()
                p.unlink()
            raise
        return cls(name, pools)

    @classmethod
    def attach(cls, name: str, *, writer: bool = False) -> SlabPool:
        pools: list[HostPool] = []
        while os.path.exists(os.path.join(SHM_DIR, _segment(name, len(pools)))):
            pools.append(HostPool.attach(_segment(name, len(pools)), writer=writer))
        if not pools:
            raise FileNotFoundError(f"no slab pool segments named {name}.c*")
        return cls(name, pools)

    def alloc(self, nbytes: int) -> SlabRef:
        """A slot in the smallest class that fits ``nbytes`` and has room."""
        if nbytes > self.class_bytes[-1]:
            raise PageTooLarge(
                f"{nbytes} bytes exceed the largest class ({self.class_bytes[-1]} B)"
            )
        first = int(np.searchsorted(self.class_bytes, nbytes))
        for i in range(first, len(self._pools)):  # a few classes, not elements
            try:
                return SlabRef(i, self._pools[i].alloc())
            except PoolFull:
                continue
        raise PoolFull(f"{self.name}: no free slot of >= {nbytes} B in any class")

    def write(self, ref: SlabRef, data) -> int:
        return self._pool(ref).write(ref.slot, data)

    def read(self, ref: SlabRef, out=None) -> memoryview | bytes:
        return self._pool(ref).read(ref.slot, out)

    def read_versioned(self, ref: SlabRef, out=None) -> tuple[memoryview | bytes, int]:
        return self._pool(ref).read_versioned(ref.slot, out)

    def free(self, ref: SlabRef, *, scrub: bool = False) -> None:
        self._pool(ref).free(ref.slot, scrub=scrub)

    def stats(self) -> SlabStats:
        return SlabStats(classes=tuple(p.stats() for p in self._pools))

    def close(self) -> None:
        for p in self._pools:
            p.close()

    def unlink(self) -> None:
        for p in self._pools:
            p.unlink()

    def _pool(self, ref: SlabRef) -> HostPool:
        if not 0 <= ref.size_class < len(self._pools):
            raise SlotEmpty(f"{self.name}: no size class {ref.size_class}")
        return self._pools[ref.size_class]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
