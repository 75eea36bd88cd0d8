"""NVMe shards: append-only segment files of checksummed records, with crash recovery.

    shard.py     NvmeShard: put / get / delete by key, and its maintenance as methods
                 (recovery, compaction, shred, shred_dead, prune, drop_cache)
    segments.py  SegmentFiles: the directory, its lock, the file engine and the bytes
    index.py     RecordIndex: which record of each key is live (bookkeeping only)
    reserve.py   SpaceReserve: blocks held back so a full file system can still retire
    engines.py   how bytes move: direct syscalls (default) or NIXL POSIX jobs
    format.py    the on-disk record format and the segment scan
    files.py     file-system helpers (keys and views, free space, page cache, mincore)
    types.py     configuration, records, reports and errors

``from store.nvme import NvmeShard, NvmeShardConfig, ...`` is the public surface.
"""

from store.nvme.shard import NvmeShard
from store.nvme.types import (
    CompactionReport,
    DiskFull,
    FsyncPolicy,
    FullResource,
    InvalidRecord,
    NvmeEngine,
    NvmeShardConfig,
    QuotaFull,
    RecordExtent,
    RecordLocation,
    SegmentNotCreated,
    ShardClosed,
    ShardError,
    ShardForked,
    ShardIOError,
    ShardLocked,
    ShardStats,
    ShardUnavailable,
)

__all__ = [
    "CompactionReport",
    "DiskFull",
    "FsyncPolicy",
    "FullResource",
    "InvalidRecord",
    "NvmeEngine",
    "NvmeShard",
    "NvmeShardConfig",
    "QuotaFull",
    "RecordExtent",
    "RecordLocation",
    "SegmentNotCreated",
    "ShardClosed",
    "ShardError",
    "ShardForked",
    "ShardIOError",
    "ShardLocked",
    "ShardStats",
    "ShardUnavailable",
]
