"""The vocabulary every layer shares: tiers and page forms.

This module imports nothing heavy on purpose: the pure policy code and the
simulator import it too.
"""

from __future__ import annotations

import enum


class Tier(enum.IntEnum):
    """Where a copy of a page lives, fastest first."""

    HBM = 0
    HOST = 1  # host DDR / CXL-like shared-memory pool
    NVME = 2


class Codec(enum.IntEnum):
    """The form a page's bytes take, most faithful first."""

    FULL = 0  # fp16 / bf16 / fp32 pass-through
    INT8 = 1  # per-token groups
    INT4 = 2  # KIVI: keys per channel, values per token
    LOW_RANK = 3  # per-head truncated SVD
    RECOMPUTE = 4  # token ids + identity only; bytes are re-prefilled

    @property
    def is_lossy(self) -> bool:
        return self in (Codec.INT8, Codec.INT4, Codec.LOW_RANK)


class Lookup(enum.Enum):
    """Result of a directory or tier lookup (never ``bool | None``)."""

    HIT = "hit"
    MISS = "miss"
    PENDING = "pending"


# The element types a KV page may hold, by name, with their sizes: the one table (the page
# header stores the index into it; ``store.codecs.spec.KV_DTYPES`` maps the names to torch).
KV_DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}
KV_DTYPE_NAMES: tuple[str, ...] = tuple(KV_DTYPE_BYTES)


class StoreError(Exception):
    """Base class of the failures of the store's tiers."""


class PoolError(StoreError):
    """Base class for host pool failures (``store.host_pool``)."""


class ArenaError(StoreError):
    """Base class for HBM arena failures (``store.hbm``)."""


class PageTooLarge(PoolError, ArenaError, ValueError):
    """The data does not fit one slot or page of the tier it was given to (a host pool slot
    or an HBM arena page): one class, so a caller of either tier catches it with that
    tier's base error."""
