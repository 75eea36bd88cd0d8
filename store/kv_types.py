"""The vocabulary of the keyed store (``store.kv``): its errors, configuration and
reservations, and the checks of its arguments (lengths, tiers, values)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from store.nvme import NvmeShardConfig
from store.parallel import as_bytes
from store.types import Tier

__all__ = ["ForeignTenant", "KVError", "KVStoreConfig", "KeyMissing", "NoRoom", "Reservation",
           "ReservationClosed", "StoreClosed", "ValueTooLarge", "length_arg", "source_bytes",
           "tier_arg"]


class KVError(Exception):
    """Base class of library store failures."""


class KeyMissing(KVError, KeyError):
    """No readable value under that key (never stored, deleted, or failed to open)."""


class ValueTooLarge(KVError, ValueError):
    """The value is larger than ``slot_bytes``."""


class NoRoom(KVError):
    """Neither tier could take the value."""


class StoreClosed(KVError):
    """The store was used after ``close()``."""


class ReservationClosed(KVError):
    """The reservation was committed or aborted already, or is another store's."""


class ForeignTenant(KVError):
    """The NVMe directory holds records of another live tenant of the keyring (a store
    opened under the wrong tenant would otherwise retire them as records that do not open)."""


@dataclass(frozen=True, kw_only=True)
class KVStoreConfig:
    name: str  # host pool segment in /dev/shm (unique per store)
    slot_bytes: int  # the largest value
    host_slots: int = 0  # 0: no host tier
    nvme_dir: str | None = None  # None: no NVMe tier
    nvme: NvmeShardConfig = field(default_factory=NvmeShardConfig)

    def __post_init__(self) -> None:
        if self.slot_bytes <= 0 or self.host_slots < 0:
            raise ValueError("slot_bytes must be positive and host_slots non-negative")
        if not self.host_slots and self.nvme_dir is None:
            raise ValueError("a store needs a host tier, an NVMe tier, or both")


@dataclass(slots=True)
class Reservation:
    """Room for one value (``KVStore.reserve``): committed or aborted once, after which its
    buffer is no longer the caller's."""

    key: bytes
    nbytes: int
    tier: Tier
    buffer: np.ndarray  # write the value here, then ``commit``
    slot: int = -1  # host slot, or -1 (NVMe, or an empty value)
    target: np.ndarray | None = None  # sealed: the reserved slot the record is sealed into
    owner: object = field(default=None, repr=False, compare=False)  # the store; None: done
    lent: bool = field(default=False, repr=False)  # ``buffer`` is the store's spare one


def source_bytes(value: Any) -> np.ndarray:
    """``value``'s bytes as a flat uint8 array: no copy of a C-contiguous buffer, a C-order
    copy of any other."""
    if isinstance(value, np.ndarray):
        return as_bytes(value if value.flags.c_contiguous else np.ascontiguousarray(value))
    view = memoryview(value)
    return as_bytes(view.cast("B") if view.c_contiguous else np.ascontiguousarray(view))


def length_arg(nbytes: object) -> int:
    try:
        n = operator.index(nbytes)
    except TypeError:
        raise TypeError(f"nbytes must be an int, got {nbytes!r:.40}") from None
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    return n


def tier_arg(tier: object) -> Tier:
    if tier not in (Tier.HOST, Tier.NVME):
        raise ValueError(f"tier must be Tier.HOST or Tier.NVME, got {tier!r:.40}")
    return Tier(tier)
