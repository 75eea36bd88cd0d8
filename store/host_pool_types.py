"""The host pool's vocabulary: its errors and its usage record (``store.host_pool``, which
re-exports every name here)."""

from __future__ import annotations

from dataclasses import dataclass

from store.types import PoolError

__all__ = ["EmptyPage", "NotWriter", "PoolBusy", "PoolForked", "PoolFormatError", "PoolFull",
           "PoolStats", "SlotEmpty", "TornRead"]


class PoolFull(PoolError):
    """Every slot is allocated."""


class PoolBusy(PoolError):
    """Another live process already holds the writer role."""


class PoolFormatError(PoolError):
    """The segment is not a host pool this code reads."""


class NotWriter(PoolError):
    """Only the writer may allocate, write or free."""


class PoolForked(NotWriter):
    """The writer handle is used in a fork child (``store.forks``): the role is the parent's."""


class SlotEmpty(PoolError, KeyError):
    """The slot is free, or allocated but holds no complete page."""


class TornRead(PoolError):
    """No consistent copy could be taken (the writer died mid-write, or never let go)."""


class EmptyPage(PoolError, ValueError):
    """Zero bytes is not a page (a zero length marks a slot that holds none)."""


@dataclass(frozen=True, kw_only=True)
class PoolStats:
    name: str
    slot_bytes: int
    num_slots: int
    used_slots: int
    used_bytes: int  # bytes of page data held in allocated slots

    @property
    def capacity_bytes(self) -> int:
        return self.slot_bytes * self.num_slots

    @property
    def free_slots(self) -> int:
        return self.num_slots - self.used_slots

    @property
    def fragmentation(self) -> float:
        """Share of allocated slot bytes that hold no page data (internal fragmentation)."""
        held = self.used_slots * self.slot_bytes
        return 0.0 if held == 0 else 1.0 - self.used_bytes / held
