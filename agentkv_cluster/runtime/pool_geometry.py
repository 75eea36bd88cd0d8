"""How much room a pool actor sets aside for one page, and the smallest settings that hold
a page of ``hbm.page_bytes``. Pure arithmetic, in one place for the pool actor (which sizes
its buffers by it) and the config checks (which refuse settings under which it could never
keep a full page: every demotion would fail, and the HBM would fill up with pages that
cannot leave it).

A pool sizes everything by ``pool.slot_bytes`` (``S``): a host-pool slot holds a sealed
record of up to ``host_slot_bytes(S)`` bytes, and so does each record buffer its NVMe
stores seal into; its staging slots, which pages are pulled into, hold
``staging_slot_bytes(S)``. A page of ``n`` bytes is stored as a sealed record of
``record_size(n)`` bytes (``security.record_layout``: padded to a size class), so a slot
somewhat smaller than the page still holds it when the page's record fits; one that holds
only a compressed (INT8/INT4) form is not enough (``agentkv_cluster.config_sizes``).

On the NVMe shard a record also takes a header block (its key: the 32-byte slot identity,
padded to the shard's alignment), and the shard's quota ``pool.nvme_bytes`` counts both.
"""

from __future__ import annotations

from agentkv_cluster.runtime.pool_records import sealed_total
from security.record_layout import record_size
from store.nvme import NvmeShardConfig
from store.nvme.format import header_block

# Beyond the largest sealed record of a ``slot_bytes`` page: a host slot's spare bytes, and
# a staging slot's (pulls may carry a codec's header past the page's own bytes).
HOST_SLOT_SPARE = 1024
STAGING_SLOT_SPARE = 4096
NVME_KEY_BYTES = 32  # a version-2 record's NVMe key: its blinded slot identity


def host_slot_bytes(slot_bytes: int) -> int:
    """Bytes of one host-pool slot (and of one NVMe record buffer) for ``pool.slot_bytes``;
    the host pool rounds it up to whole 4 KiB pages, which these rules do not count on."""
    return sealed_total(slot_bytes) + HOST_SLOT_SPARE


def staging_slot_bytes(slot_bytes: int) -> int:
    """Bytes of one staging slot of the pool's mover for ``pool.slot_bytes``."""
    return sealed_total(slot_bytes) + STAGING_SLOT_SPARE


def holds(slot_bytes: int, page_bytes: int) -> bool:
    """Whether a pool with slots of ``slot_bytes`` stores a FULL page of ``page_bytes``:
    its sealed record fits a host slot (and so a record buffer; the staging slot, larger
    still, then holds the page's bytes)."""
    return record_size(page_bytes) <= host_slot_bytes(slot_bytes)


def smallest_slot_bytes(page_bytes: int) -> int:
    """The smallest ``pool.slot_bytes`` that holds a FULL page of ``page_bytes`` (at most
    ``page_bytes``: a slot of one page always does)."""
    low, high = 1, page_bytes  # holds() only grows with the slot: bisect the boundary
    while low < high:
        mid = (low + high) // 2
        if holds(mid, page_bytes):
            high = mid
        else:
            low = mid + 1
    return low


def nvme_record_bytes(page_bytes: int, align: int = NvmeShardConfig().align) -> int:
    """Bytes the NVMe shard's quota counts for one FULL page of ``page_bytes``: the record's
    header block and the sealed record (the smallest ``pool.nvme_bytes`` that holds one)."""
    return header_block(NVME_KEY_BYTES, align) + record_size(page_bytes)


__all__ = ["holds", "host_slot_bytes", "nvme_record_bytes", "smallest_slot_bytes",
           "staging_slot_bytes"]
