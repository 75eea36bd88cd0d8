"""The segment files of one NVMe shard directory, and the bytes in them.

``SegmentFiles`` owns the directory lock, the file engine and every open segment: it
appends records (header block + payload in one write, rolled back on failure, synced per
the fsync policy), reads and verifies payloads, zeroes payloads for erasure, evicts
records from the page cache, scans segments at recovery and removes compacted ones. It
keeps no index: the shard (``store.nvme.shard``) decides which records are live. It holds
the shard's space reserve (``store.nvme.reserve``): tombstones and compaction copies that
find the file system full draw on it, puts never do. A file system that refuses the next
segment file (``SegmentNotCreated``: out of inodes, space or quota) fails a put, while
tombstones and compaction copies then go to the active segment past ``segment_bytes``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store.nvme import format as fmt
from store.nvme.engines import open_engine, read_full
from store.nvme.files import (
    drop_range,
    free_bytes,
    free_inodes,
    fsync_dir,
    full_resource,
    lock_directory,
)
from store.nvme.reserve import SpaceReserve
from store.nvme.types import (
    DiskFull,
    FsyncPolicy,
    NvmeShardConfig,
    QuotaFull,
    RecordExtent,
    RecordLocation,
    SegmentNotCreated,
    ShardIOError,
)

SEGMENT_GLOB = "seg-*.akv"  # seg-00000012.akv; indices only grow
_SEGMENT_NAME = re.compile(r"seg-([0-9]+)\.akv")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FREE_MARGIN = 256 << 20  # re-read free space when the estimate gets this close
_ZEROS = memoryview(bytes(fmt.MAX_KEY_BYTES))
_ZERO_CHUNK = 1 << 20


class Segment:
    __slots__ = ("fd", "handle", "index", "keys", "path", "size")

    def __init__(self, index: int, path: Path, fd: int, handle: Any, size: int) -> None:
        self.index, self.path, self.fd, self.handle, self.size = index, path, fd, handle, size
        self.keys: set[bytes] = set()  # every key with a record or tombstone in this file


class SegmentFiles:
    """Open with the directory locked; ``load`` the existing segments before appending."""

    def __init__(self, path: Path, config: NvmeShardConfig) -> None:
        self.path, self.config = path, config
        path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_directory(path)
        try:
            self._reserve = SpaceReserve(self._lock_fd, config)  # held in the LOCK file
            self._reserve.fill(free_bytes(path))
            self._io = open_engine(config)
        except BaseException:
            os.close(self._lock_fd)
            raise
        # The header block of every append; bytes past the longest key are never written.
        self._header = memoryview(bytearray(fmt.header_block(fmt.MAX_KEY_BYTES, config.align)))
        self._key_end = 0  # where the key last packed into it ends
        self._segments: dict[int, Segment] = {}
        self._active: Segment | None = None  # the newest segment
        self._unsynced = 0
        self.syncs = 0  # fsync calls made
        self._free_estimate = 0  # bytes the file system had free, less what we wrote since

    @property
    def engine(self) -> str:
        return self._io.name

    # -- recovery ---------------------------------------------------------------------------
    def load(self, visit: Callable[[int, fmt.ScannedRecord], None]) -> None:
        """Open every segment file in index order and hand each complete record to
        ``visit(segment, record)``; then cut a torn tail off the newest segment so the next
        append starts on clean ground (or start segment 0 in an empty directory)."""
        last_end = 0
        for index in segment_indices(self.path):
            seg = self._open(index)
            last_end = 0
            for rec in fmt.scan_segment(seg.fd, seg.size, self.config.align):
                seg.keys.add(rec.header.key)
                last_end = rec.end
                visit(seg.index, rec)
        if self._active is None:
            self._open(0)
        elif self._active.size > last_end:
            os.ftruncate(self._active.fd, last_end)
            self._active.size = last_end

    def _open(self, index: int) -> Segment:
        path = self.path / segment_name(index)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if self.config.fsync is not FsyncPolicy.NONE:
                fsync_dir(self.path)
            handle = self._io.attach(fd)
        except BaseException:
            os.close(fd)
            raise
        seg = Segment(index, path, fd, handle, os.fstat(fd).st_size)
        self._segments[index] = seg
        self._active = seg  # indices only grow: the newest segment is the active one
        return seg

    # -- writing ----------------------------------------------------------------------------
    def append(self, key: bytes, payload: memoryview, generation: int, seq: int,
               flags: int = 0, *, over_quota: bool = False) -> RecordLocation:
        """Write one record at the end of the active segment (a new one when it is full);
        on failure nothing of it stays (``DiskFull`` / ``ShardIOError``). ``over_quota``:
        the record may pass ``max_bytes`` (compaction's copies, whose old files go next)."""
        align = self.config.align
        key_end = fmt.HEADER.size + len(key)
        block = fmt.header_block(len(key), align)
        n = payload.nbytes
        # One hash for a payload up to a stripe (most records); payload_digest stripes the rest.
        digest = fmt.checksum(payload) if n <= fmt.STRIPE_BYTES else fmt.payload_digest(payload)
        # Tombstones and compaction's copies pass the quota and may draw on the reserve.
        exempt = over_quota or bool(flags & fmt.FLAG_TOMBSTONE)
        seg = self._room(fmt.round_up(block + n, align), exempt)
        offset = fmt.round_up(seg.size, align)
        need = offset - seg.size + block + n
        self._check_space(need, exempt)
        header = self._header
        if key_end < self._key_end:  # zero the tail of a longer key written before
            header[key_end : self._key_end] = _ZEROS[: self._key_end - key_end]
        self._key_end = key_end
        fmt.pack_fields_into(header, flags, key, generation, n, seq, digest)
        try:
            self._write(seg, offset, header[:block], payload)
        except DiskFull:  # the OS refused more than statvfs showed: once more, from the reserve
            if not (exempt and self._reserve.draw(need)):
                raise
            self._write(seg, offset, header[:block], payload)
        seg.size = offset + block + n
        seg.keys.add(key)
        self._after_write(seg)
        return RecordLocation(
            seg.index, offset, offset + block, n, generation, seq, digest, fmt.FORMAT_VERSION
        )

    def _room(self, need: int, exempt: bool) -> Segment:
        """The segment an append of ``need`` bytes goes to: a new one when the active one
        would pass ``segment_bytes``. When the file system refuses the new file, an
        ``exempt`` append (a tombstone, a compaction copy) goes to the active segment past
        ``segment_bytes`` (a rotation threshold: a record larger than it always did), so a
        file system out of inodes still deletes, shreds and compacts."""
        active = self._active
        if not active.size or active.size + need <= self.config.segment_bytes:
            return active
        try:
            return self.seal_active()
        except SegmentNotCreated:
            if not exempt:
                raise
            return active

    def seal_active(self) -> Segment:
        """Start a new segment (the old active one synced, unless the policy is NONE).
        When the file system refuses the new file: ``SegmentNotCreated`` (out of inodes,
        space or quota) or ``ShardIOError``, and the active segment stays the active one."""
        if self.config.fsync is not FsyncPolicy.NONE:
            self.sync_active()
        index = self._active.index + 1
        try:
            return self._open(index)
        except OSError as exc:
            path = self.path / segment_name(index)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                resource = full_resource(exc.errno, free_inodes(self.path))
                raise SegmentNotCreated(str(path), resource, exc.errno) from exc
            raise ShardIOError(f"cannot create segment file {path}: {exc}") from exc

    def _check_space(self, need: int, exempt: bool) -> None:
        # Tombstones (one header block) and compaction's copies are exempt from the quota,
        # and draw on the reserve when the file system is full: a full shard must still be
        # able to retire records and reclaim their space.
        quota = self.config.max_bytes
        if quota is not None and not exempt:
            total = self.file_bytes()
            if total + need > quota:
                raise QuotaFull(quota, total, need)
        # statvfs only when the running estimate nears the need; a write that still finds
        # the disk full is rolled back the same way.
        if self._free_estimate < need + _FREE_MARGIN:
            free = free_bytes(self.path)
            if exempt and free < need and self._reserve.draw(need):
                free = free_bytes(self.path)
            elif not exempt:
                free -= self._reserve.fill(free)  # the reserve comes back before puts
            self._free_estimate = free
            if free < need:
                raise DiskFull(f"file system of {self.path} has less than {need} B free")
        self._free_estimate -= need

    def fill_reserve(self) -> None:
        """Grow the reserve back to its size if the file system has room for all it lacks
        (after compaction removed segments)."""
        if self._reserve.deficit > 0:
            self._reserve.fill(free_bytes(self.path))
            self._free_estimate = 0  # look at the file system again next time

    def room_for_copies(self) -> int:
        """Bytes compaction's copies can surely take now: what the file system has free, or
        the space reserve, which a copy draws on only when it covers all that copy needs."""
        return max(free_bytes(self.path), self._reserve.held)

    @property
    def reserve_bytes(self) -> int:
        """Bytes the space reserve holds now."""
        return self._reserve.held

    @property
    def reserve_target_bytes(self) -> int:
        """Bytes the space reserve holds when full (``pool.nvme_reserve_tombstones``)."""
        return self._reserve.target

    def _write(self, seg: Segment, offset: int, header: memoryview, payload: memoryview) -> None:
        try:
            self._io.write(seg.handle, offset, header, payload)
        except OSError as exc:
            os.ftruncate(seg.fd, seg.size)  # roll back
            self._free_estimate = 0  # look at the file system again next time
            need = header.nbytes + payload.nbytes
            if exc.errno in _FULL_ERRNOS or free_bytes(self.path) < need:
                raise DiskFull(f"writing {need} B to {seg.path} failed: {exc}") from exc
            raise ShardIOError(f"writing to {seg.path} failed: {exc}") from exc

    def _after_write(self, seg: Segment) -> None:
        policy = self.config.fsync
        self._unsynced += 1
        if policy is FsyncPolicy.EVERY_RECORD or (
            policy is FsyncPolicy.EVERY_N and self._unsynced >= self.config.fsync_every_n
        ):
            self._fsync(seg.fd)
            self._unsynced = 0

    def sync_active(self) -> None:
        """fsync the active segment if anything was appended since the last sync."""
        if self._unsynced:
            self._fsync(self._active.fd)
        self._unsynced = 0

    def sync_newest(self) -> None:
        """fsync the active segment whatever the policy (compaction, before files go)."""
        self._fsync(self._active.fd)
        self._unsynced = 0

    def _fsync(self, fd: int) -> None:
        os.fsync(fd)
        self.syncs += 1

    # -- reading ----------------------------------------------------------------------------
    def read(self, loc: RecordLocation, out: Any) -> memoryview | None:
        """The verified payload (in ``out`` or the engine's buffer), None if bad or gone."""
        if loc.length == 0:
            return memoryview(b"") if loc.checksum == fmt.checksum(b"") else None
        return self._io.read(self._segments[loc.segment].handle, loc, out)

    def read_range(self, loc: RecordLocation, out: memoryview, offset: int) -> bool:
        """``out.nbytes`` payload bytes from ``offset``, unverified (a payload is verified
        whole); False when they cannot all be read."""
        return read_full(self._segments[loc.segment].fd, out, loc.payload_offset + offset)

    def extent(self, loc: RecordLocation) -> RecordExtent:
        return RecordExtent(path=self._segments[loc.segment].path, offset=loc.offset,
                            length=loc.record_bytes, payload_offset=loc.payload_offset,
                            payload_length=loc.length)

    def drop_cache(self, loc: RecordLocation) -> None:
        drop_range(self._segments[loc.segment].fd, loc.offset, loc.record_bytes)

    # -- erasure ----------------------------------------------------------------------------
    def zero_payload(self, loc: RecordLocation) -> None:
        """Overwrite ``loc``'s payload with zeros where it lies, and sync."""
        seg = self._segments[loc.segment]
        _zero_range(seg.fd, loc.payload_offset, loc.length)
        self._fsync(seg.fd)

    def zero_dead(self, live: set[tuple[int, int]]) -> int:
        """Zero the payload of every record whose (segment, offset) is not in ``live`` and
        sync what changed; returns how many records were zeroed. Reads every header."""
        zeroed = 0
        for seg in self._segments.values():
            touched = False
            for rec in fmt.scan_segment(seg.fd, seg.size, self.config.align):
                h = rec.header
                if h.is_tombstone or not h.payload_len or (seg.index, rec.offset) in live:
                    continue
                if _zero_range(seg.fd, rec.payload_offset, h.payload_len):
                    zeroed += 1
                    touched = True
            if touched:
                self._fsync(seg.fd)
        return zeroed

    # -- compaction -------------------------------------------------------------------------
    def sizes(self) -> dict[int, int]:
        """Bytes in each segment file, by index."""
        return {i: s.size for i, s in self._segments.items()}

    @property
    def active_index(self) -> int:
        return self._active.index

    def holds(self, key: bytes, excluding: set[int]) -> bool:
        """Whether a segment outside ``excluding`` has a record or tombstone of ``key``."""
        return any(key in s.keys for i, s in self._segments.items() if i not in excluding)

    def remove(self, index: int) -> int:
        """Close and delete segment ``index``; returns the bytes it held."""
        seg = self._segments.pop(index)
        self._io.detach(seg.handle)
        os.close(seg.fd)
        seg.path.unlink()
        return seg.size

    # -- totals and teardown ----------------------------------------------------------------
    def file_bytes(self) -> int:
        return sum(s.size for s in self._segments.values())

    def __len__(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        """Release the engine (its registrations and helper thread), the files, the lock."""
        self._io.close()
        for seg in self._segments.values():
            os.close(seg.fd)
        self._segments.clear()
        os.close(self._lock_fd)


def segment_indices(directory: Path) -> list[int]:
    """The indices of the segment files in ``directory``, in order. Only names the shard
    gives its segments count: another file that matches ``SEGMENT_GLOB`` (an operator's
    copy, ``seg-00000003.old.akv``) is left alone, neither read nor changed."""
    indices = []
    for path in directory.glob(SEGMENT_GLOB):
        m = _SEGMENT_NAME.fullmatch(path.name)
        if m and path.name == segment_name(int(m.group(1))):
            indices.append(int(m.group(1)))
    return sorted(indices)


def segment_name(index: int) -> str:
    """The file name of segment ``index`` (``seg-00000012.akv``)."""
    return f"seg-{index:08d}.akv"


def _zero_range(fd: int, offset: int, length: int) -> bool:
    """Overwrite ``length`` bytes at ``offset`` with zeros unless they are zero already;
    True if it wrote."""
    wrote = False
    end = offset + length
    while offset < end:
        n = min(_ZERO_CHUNK, end - offset)
        if os.pread(fd, n, offset).count(0) != n:
            os.pwrite(fd, bytes(n), offset)
            wrote = True
        offset += n
    return wrote
