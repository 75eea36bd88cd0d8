"""The vocabulary of the keyed store (``store.kv``): its errors and configuration, and the checks of its arguments (lengths, tiers, values, ``out`` buffers)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from security.chunked import record_size
from store.nvme import NvmeShardConfig
from store.nvme.format import MAX_KEY_BYTES
from store.parallel import as_bytes
from store.types import Tier

__all__ = ["BadConfig", "BadKey", "BadOutBuffer", "ForeignKeyring", "ForeignTenant", "KVError",
           "KVStoreConfig", "KeyMissing", "NoRoom", "ReplaceFailed", "ReservationClosed",
           "SealingMismatch", "StoreClosed", "StoreForked", "ValueTooLarge", "check_room",
           "fit_out", "key_arg", "length_arg", "out_arg", "source_bytes", "tier_arg"]


class KVError(Exception):
    """Base class of library store failures."""


class KeyMissing(KVError, KeyError):
    """No readable value under that key (never stored, deleted, or failed to open)."""


class ValueTooLarge(KVError, ValueError):
    """The value is larger than ``slot_bytes``."""


class NoRoom(KVError):
    """Neither tier could take the value."""


class ReplaceFailed(KVError):
    """A ``put`` that had to write over its key's own host slot (a host-only store with
    every slot taken) failed part-way: the old value is gone and the key reads as missing.
    The failure is chained as ``__cause__``."""


class BadOutBuffer(KVError, ValueError, TypeError):
    """``get``'s ``out`` is not a writable, C-contiguous buffer of plain (non-object)
    elements with room for the value; the same error and message shape on every tier."""


class BadKey(KVError, ValueError, TypeError):
    """A key is ``bytes`` of 1..255 bytes (the NVMe record format's limit, kept on every
    tier so a key never works on the host and fails once it spills)."""


class StoreClosed(KVError):
    """The store was used after ``close()``."""


class StoreForked(KVError):
    """The store was used in a fork child of the process that opened it (``store.forks``):
    its locks, slots, files and indexes are the parent's, and a write would land on the
    parent's next slot or NVMe offset. The child opens a store of its own (``close`` in the
    child only marks this one closed, leaving the parent's tiers alone)."""


class BadConfig(KVError, ValueError):
    """The configuration cannot hold what it promises (a value of ``slot_bytes`` that the
    NVMe tier would refuse as a record larger than ``nvme.max_record_bytes``)."""


class ReservationClosed(KVError):
    """The reservation was committed or aborted already, or is another store's."""


class ForeignTenant(KVError):
    """The NVMe directory holds records of another live tenant of the keyring (a store
    opened under the wrong tenant would otherwise retire them as records that do not open)."""


class ForeignKeyring(ForeignTenant):
    """The NVMe directory holds intact sealed records that open under no key of the keyring,
    which records no erasure that explains them: written with another keyring (the same
    tenant name, other keys). Retiring them would delete every value; the open fails
    first, touching nothing. Records of erased generations, or of a tenant whose erasure
    the keyring records, are still retired."""


class SealingMismatch(KVError):
    """The NVMe directory holds records written with sealing set the other way: unsealed
    records under a sealed store (which would retire them as records that do not open) or
    sealed records under an unsealed one. The open fails before anything is touched."""

    def __init__(self, directory: str, *, sealed_store: bool, sealed: int, plain: int) -> None:
        self.directory, self.sealed_store = directory, sealed_store
        self.sealed_records, self.plain_records = sealed, plain
        found = f"{plain} unsealed and {sealed} sealed records"
        want = "sealing=None" if sealed_store else "the Sealing it was written with"
        super().__init__(
            f"NVMe directory {directory} holds {found}; a {'sealed' if sealed_store else 'unsealed'}"
            f" store does not open it (nothing was changed): open it with {want}, or give "
            f"this store another directory")


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
        if self.nvme_dir is not None and not str(self.nvme_dir).strip():
            raise ValueError("nvme_dir must name a directory (None: no NVMe tier), not ''")
        check_room(self)


def check_room(config: KVStoreConfig, sealed: bool = False) -> int:
    """The bytes a value of ``slot_bytes`` takes stored (a sealed record is larger:
    ``security.chunked.record_size``); ``BadConfig`` when that passes the NVMe tier's
    ``max_record_bytes``: every put the store accepts must also fit that tier."""
    if not isinstance(config, KVStoreConfig):
        raise TypeError(f"a store's config must be a store.kv.KVStoreConfig, not "
                        f"{type(config).__name__}")
    record_bytes = record_size(config.slot_bytes) if sealed else config.slot_bytes
    limit = config.nvme.max_record_bytes
    if config.nvme_dir is not None and record_bytes > limit:
        raise BadConfig(f"a value of slot_bytes {config.slot_bytes} is an NVMe record of "
                        f"{record_bytes} B, over nvme.max_record_bytes {limit}: lower "
                        f"slot_bytes or raise max_record_bytes")
    return record_bytes


def source_bytes(value: Any) -> np.ndarray:
    """``value``'s bytes as a flat uint8 array: no copy of a C-contiguous buffer, a C-order
    copy of any other. ``TypeError`` for what is not a buffer of plain elements (an array
    of Python objects would store their addresses)."""
    if isinstance(value, np.ndarray) and value.dtype.hasobject:
        raise TypeError("a value must be a buffer of plain elements, not of Python objects")
    if isinstance(value, np.ndarray):
        return as_bytes(value if value.flags.c_contiguous else np.ascontiguousarray(value))
    view = memoryview(value)
    if "O" in view.format:
        raise TypeError("a value must be a buffer of plain elements, not of Python objects")
    return as_bytes(view.cast("B") if view.c_contiguous else np.ascontiguousarray(view))


def out_arg(out: Any) -> np.ndarray:
    """``out`` as a flat uint8 array over its own memory (no copy), or ``BadOutBuffer``. An
    array is taken by its flags, not as a buffer: numpy exports no buffer of some dtypes
    (datetime64) that ``put`` stores as they are."""
    if isinstance(out, np.ndarray):
        objects, readonly, contiguous = (out.dtype.hasobject, not out.flags.writeable,
                                         out.flags.c_contiguous)
    else:
        try:
            view = memoryview(out)
        except (TypeError, ValueError):
            raise _bad_out(f"a {type(out).__name__}, not a buffer") from None
        objects, readonly, contiguous = "O" in view.format, view.readonly, view.c_contiguous
    if objects:
        raise _bad_out("an array of Python objects")
    if readonly:
        raise _bad_out("read-only")
    if not contiguous:
        raise _bad_out("not C-contiguous")
    if isinstance(out, np.ndarray):
        return out.reshape(-1).view(np.uint8)  # contiguous: a view, never a copy
    return np.frombuffer(view, np.uint8)


def fit_out(flat: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` bytes of a checked ``out``; ``BadOutBuffer`` if it holds fewer."""
    if flat.shape[0] < n:
        raise _bad_out(f"too small ({flat.shape[0]} B, the value has {n} B)")
    return flat[:n]


def _bad_out(problem: str) -> BadOutBuffer:
    return BadOutBuffer(f"out is {problem}: get needs a writable, C-contiguous buffer of plain "
                       f"elements with room for the value")


def no_room(key: bytes, tier: Tier, host_slots: int, reserved_over_key: bool) -> NoRoom:
    """Why a value found no tier; ``reserved_over_key``: a reservation of a key held on the
    host (it never reuses that slot)."""
    why = "this store has no NVMe tier" if tier is Tier.NVME else (
        f"all {host_slots} host slots are taken and there is no NVMe tier")
    if reserved_over_key:
        why += ("; a reservation does not reuse its key's slot (the value stays readable "
                "until commit): put() replaces in place, or delete the key first")
    return NoRoom(f"{key!r:.40}: {why}")


def key_arg(key: object) -> None:
    """``BadKey`` unless ``key`` is ``bytes`` of 1..255 bytes (a ``str``, a ``bytearray``
    or an int is refused too: keys are hashed and compared as immutable bytes)."""
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise BadKey(f"a key must be bytes of 1..{MAX_KEY_BYTES} bytes, got {key!r:.60}")


def length_arg(nbytes: object) -> int:
    """``nbytes`` as an int >= 0; a bool is refused (``reserve(key, True)`` held a byte)."""
    if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__"):
        raise TypeError(f"nbytes must be an int, got {nbytes!r:.40}")
    n = operator.index(nbytes)
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    return n


def tier_arg(tier: object) -> Tier:
    if isinstance(tier, bool) or tier not in (Tier.HOST, Tier.NVME):  # True == Tier.HOST
        raise ValueError(f"tier must be Tier.HOST or Tier.NVME, got {tier!r:.40}")
    return Tier(tier)
