"""The rules between size settings: one page of ``hbm.page_bytes`` must fit a wire frame, a
pool slot and the NVMe shard's quota. A setting that breaks one is refused at load time,
naming it and the smallest value (or largest, for the page) that works. The service would
otherwise start and fail later: stores of a full page refused by the frame limit, or every
demotion of a full page failing, which a client sees only as an HBM full of pinned pages.

Only combinations that cannot work are refused. A pool slot too small for a FULL page but
large enough for its INT8 or INT4 form is one of them: the LRU policy (which a running
``Service`` can switch to, as the demo does), pages without KV geometry, the risk
controller's references, fixed-prefix write-through and, under pressure, AgentKV's own
choices store pages FULL (with 128 KiB pages in 80 KiB slots, every demotion of both
policies failed, and stores were refused after 30 s).

The NVMe shard's space reserve (``pool.nvme_reserve_tombstones``, ``store.nvme.reserve``)
is checked here too, against the shard's own limit: it is space each shard holds beside
``pool.nvme_bytes``, and a value the shard refuses would otherwise stop every pool at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv_cluster.config import AgentKvConfig

# What a frame carries beside its pages' bytes (msgpack envelope: op, token, keys, digests):
# requests with a full page must fit in it, and the front pages its replies by it.
FRAME_ENVELOPE_BYTES = 64 << 10


@dataclass(frozen=True, kw_only=True)
class SizeConflict:
    """A size setting that cannot work with the others: the dotted field to change, why,
    and the value it needs at least (or at most, for ``hbm.page_bytes`` and a
    ``pool.nvme_reserve_tombstones`` over the shard's limit)."""

    field: str
    message: str
    bound: int


def size_conflicts(cfg: AgentKvConfig) -> list[SizeConflict]:
    """Every size rule ``cfg`` breaks (none: it is fine), in the order an operator should
    fix them. Called after each other setting passed its own range check (all positive);
    the reserve's range is checked here, where the shard's limit is imported."""
    page, frame = cfg.hbm.page_bytes, cfg.api.max_frame_bytes
    pool = cfg.pool
    out = []
    # Imported here, not at the top: the pool's geometry and the shard pull in the sealer and
    # numpy, and every start of the command line imports the config (and so this module).
    from agentkv_cluster.runtime import pool_geometry
    from store.nvme.types import MAX_RESERVE_TOMBSTONES

    reserve, most = pool.nvme_reserve_tombstones, MAX_RESERVE_TOMBSTONES
    if type(reserve) is not int or not 0 <= reserve <= most:  # what NvmeShardConfig takes
        out.append(SizeConflict(field="pool.nvme_reserve_tombstones", bound=most
                                if type(reserve) is int and reserve > most else 0, message=(
            f"must be a whole number of tombstones from 0 (no space reserve) to {most} "
            f"(8 KiB each: {most * 8 >> 10} MiB per NVMe shard), got {reserve!r}")))
    if page + FRAME_ENVELOPE_BYTES > frame:  # a store of a full page would be refused
        out.append(SizeConflict(field="hbm.page_bytes", bound=frame - FRAME_ENVELOPE_BYTES,
                                message=(
            f"a full page ({page} B) plus the request envelope ({FRAME_ENVELOPE_BYTES} B) "
            f"must fit one wire frame, but api.max_frame_bytes is {frame} B: lower "
            f"hbm.page_bytes to at most {frame - FRAME_ENVELOPE_BYTES} B or raise "
            f"api.max_frame_bytes to at least {page + FRAME_ENVELOPE_BYTES} B")))
    if pool.slot_bytes > pool.pool_bytes:
        out.append(SizeConflict(field="pool.slot_bytes", bound=pool.pool_bytes, message=(
            f"must not exceed pool.pool_bytes ({pool.pool_bytes} B), got {pool.slot_bytes} B")))
    if not pool_geometry.holds(pool.slot_bytes, page):
        least = pool_geometry.smallest_slot_bytes(page)
        out.append(SizeConflict(field="pool.slot_bytes", bound=least, message=(
            f"a pool slot of {pool.slot_bytes} B cannot hold one FULL page of hbm.page_bytes "
            f"({page} B), so a full page could never leave the HBM: set pool.slot_bytes to at least "
            f"{least} B (hbm.page_bytes always works), or lower hbm.page_bytes")))
    need = pool_geometry.nvme_record_bytes(page)
    if pool.nvme_bytes < need:
        out.append(SizeConflict(field="pool.nvme_bytes", bound=need, message=(
            f"an NVMe shard of {pool.nvme_bytes} B cannot hold one FULL page of "
            f"hbm.page_bytes ({page} B): sealed, with its record header, it takes {need} B; "
            f"set pool.nvme_bytes to at least {need} B")))
    return out


__all__ = ["FRAME_ENVELOPE_BYTES", "SizeConflict", "size_conflicts"]
