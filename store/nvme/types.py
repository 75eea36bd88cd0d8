"""Configuration, records, reports and errors of NVMe shards (see ``store.nvme.shard``)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


class ShardError(Exception):
    """Base class of NVMe shard failures."""


class DiskFull(ShardError):
    """The record does not fit (quota or file system); nothing was written or published."""


class QuotaFull(DiskFull):
    """The record does not fit the shard's quota (``max_bytes``), even after compacting
    retired space when ``compact_on_full`` is on; the file system may have room."""

    def __init__(self, quota: int, used: int, need: int) -> None:
        super().__init__(f"shard quota {quota} B: {used} B used, record needs {need} B")
        self.quota, self.used, self.need = quota, used, need

    @property
    def over(self) -> int:
        """Bytes the record would pass the quota by."""
        return self.used + self.need - self.quota

    def __reduce__(self) -> tuple[type[QuotaFull], tuple[int, int, int]]:
        return QuotaFull, (self.quota, self.used, self.need)  # crosses processes intact


class FullResource(enum.Enum):
    """What a file system ran out of when it refused a new file."""

    SPACE = "space"  # free blocks (a new directory entry may need one)
    INODES = "inodes"  # free inodes: no file can be created, however many blocks are free
    QUOTA = "quota"  # the user's disk quota (EDQUOT), of blocks or of inodes


class SegmentNotCreated(DiskFull):
    """The active segment is full and the file system refused the next segment file
    (``path``) for want of ``resource``; nothing was written and the shard is as it was:
    every record stays readable, and a put succeeds once the file system has room again.
    Tombstones and compaction's copies do not fail for it: they are appended to the active
    segment past ``segment_bytes`` instead (``store.nvme.segments``)."""

    def __init__(self, path: str, resource: FullResource, errno: int) -> None:
        super().__init__(f"cannot create segment file {path}: {_NO_ROOM[resource]} "
                         f"({os.strerror(errno)}); nothing was written")
        self.path, self.resource, self.errno = path, resource, errno

    def __reduce__(self) -> tuple[type[SegmentNotCreated], tuple[str, FullResource, int]]:
        return SegmentNotCreated, (self.path, self.resource, self.errno)


_NO_ROOM = {
    FullResource.SPACE: "the file system has no space left",
    FullResource.INODES: "the file system has no free inode left",
    FullResource.QUOTA: "the disk quota of this user is spent",
}


class ShardIOError(ShardError):
    """A write failed for another reason; the shard was rolled back to its previous state."""


class ShardLocked(ShardError):
    """Another process holds this shard directory."""


class ShardUnavailable(ShardError, OSError):
    """The shard directory or one of its files cannot be opened (no permission, not a
    directory, a read-only file system); an ``OSError`` with the cause's errno. Nothing
    in the directory was changed."""


class ShardClosed(ShardError):
    """The shard was used after ``close()``."""


class ShardForked(ShardError):
    """The shard was used in a fork child of the process that opened it (``store.forks``):
    the directory lock, the files and the index are the parent's; the child would append
    at the parent's offsets."""


class InvalidRecord(ShardError, ValueError):
    """Bad key, generation or payload handed to the shard."""


class FsyncPolicy(enum.Enum):
    NONE = "none"
    EVERY_RECORD = "every-record"
    EVERY_N = "every-n"
    ON_CLOSE = "on-close"


class NvmeEngine(enum.Enum):
    """How record bytes move (see ``store.nvme.engines``)."""

    SYSCALL = "syscall"  # os.pwritev / os.preadv on the caller's buffers
    NIXL_POSIX = "nixl-posix"  # NIXL POSIX transfer jobs


MAX_RESERVE_TOMBSTONES = 1 << 16  # 512 MiB of reserve at the default align


@dataclass(frozen=True, kw_only=True)
class NvmeShardConfig:
    segment_bytes: int = 256 << 20
    max_bytes: int | None = None  # quota over all segment files; None = file system limit
    # A put that hits max_bytes or a full file system first compacts the segments with the
    # most retired bytes, then retries; False: it raises DiskFull (QuotaFull) and only
    # compact() reclaims.
    compact_on_full: bool = True
    max_record_bytes: int = 1 << 30  # larger payloads are refused (InvalidRecord)
    fsync: FsyncPolicy = FsyncPolicy.ON_CLOSE
    fsync_every_n: int = 64
    align: int = 4096
    engine: NvmeEngine = NvmeEngine.SYSCALL
    # syscall engine: 2 = records of 4 MiB and up are read and verified on two threads
    read_threads: int = 2
    # Space held back in the shard's LOCK file for this many tombstones (2 * align each),
    # given back when a tombstone or compaction copy finds the file system full, so a full
    # disk can still delete, shred and compact; 0 = none. Not counted in max_bytes.
    # See store.nvme.reserve.
    reserve_tombstones: int = 32

    def __post_init__(self) -> None:
        if self.align < 512 or self.align & (self.align - 1):
            raise ValueError(f"align must be a power of two >= 512, got {self.align}")
        if self.segment_bytes < self.align:
            raise ValueError("segment_bytes must be at least align")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if self.max_record_bytes < 1:
            raise ValueError("max_record_bytes must be positive")
        if not isinstance(self.engine, NvmeEngine):
            raise TypeError(f"engine must be an NvmeEngine, got {self.engine!r}")
        if self.read_threads not in (1, 2):
            raise ValueError(f"read_threads must be 1 or 2, got {self.read_threads!r}")
        if self.fsync_every_n < 1:
            raise ValueError("fsync_every_n must be >= 1")
        if type(self.reserve_tombstones) is not int:
            raise TypeError(f"reserve_tombstones must be an int, got {self.reserve_tombstones!r}")
        if not 0 <= self.reserve_tombstones <= MAX_RESERVE_TOMBSTONES:
            raise ValueError(f"reserve_tombstones must be in 0..{MAX_RESERVE_TOMBSTONES}, "
                             f"got {self.reserve_tombstones}")


class RecordLocation(NamedTuple):
    """Where a record lives. A NamedTuple, not a frozen dataclass: one is built per put and
    per recovered record, and a frozen dataclass costs ~1 µs more to build."""

    segment: int
    offset: int
    payload_offset: int
    length: int
    generation: int
    seq: int
    checksum: int  # payload hash (see store.nvme.format.payload_digest)
    version: int  # record format version, which says how ``checksum`` was computed

    @property
    def record_bytes(self) -> int:
        """Bytes the record takes in its segment file: header block and payload."""
        return self.payload_offset - self.offset + self.length


@dataclass(frozen=True, kw_only=True)
class RecordExtent:
    """Where a record's bytes lie in its segment file (what ``drop_cache`` evicts, and
    what a caller checks with ``mincore``)."""

    path: Path
    offset: int  # record start (header block)
    length: int  # header block + payload
    payload_offset: int
    payload_length: int


@dataclass(frozen=True, kw_only=True)
class ShardStats:
    records: int
    segments: int
    file_bytes: int
    live_bytes: int
    corrupt_records: int
    syncs: int  # fsync calls made, per the fsync policy
    engine: str  # NvmeEngine value
    reserve_bytes: int = 0  # space reserve held now (store.nvme.reserve); not in file_bytes
    reserve_target_bytes: int = 0  # what it holds when full; more than held: drawn on


@dataclass(frozen=True, kw_only=True)
class CompactionReport:
    segments_removed: int
    bytes_reclaimed: int
    records_moved: int
    records_dropped: int
