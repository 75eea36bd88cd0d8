"""NvmeShard: append-only segment files with checksummed records and crash recovery.

Bytes move through a file engine (``store.nvme_io``: direct syscalls by default,
or NIXL POSIX jobs), so both paths share every line here; every read is
verified against the record's payload hash. A record is published in
the index only after all of its bytes are written (and synced, per policy);
a failed write is truncated away, so a full disk leaves the shard as it was.
One lock serialises callers; one process owns a shard directory (flock).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any, Self

from store import nvme_format as fmt
from store.nvme_files import (
    as_bytes_view,
    check_key,
    drop_range,
    free_bytes,
    fsync_dir,
    lock_directory,
)
from store.nvme_io import open_engine
from store.nvme_maintenance import compact_segments, rebuild_index
from store.nvme_types import (
    CompactionReport,
    DiskFull,
    FsyncPolicy,
    InvalidRecord,
    NvmeEngine,
    NvmeShardConfig,
    RecordExtent,
    RecordLocation,
    ShardClosed,
    ShardError,
    ShardIOError,
    ShardLocked,
    ShardStats,
)
from store.types import Lookup

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FREE_MARGIN = 256 << 20  # re-read free space when the estimate gets this close
_ZEROS = memoryview(bytes(fmt.MAX_KEY_BYTES))

__all__ = [
    "CompactionReport",
    "DiskFull",
    "FsyncPolicy",
    "InvalidRecord",
    "NvmeEngine",
    "NvmeShard",
    "NvmeShardConfig",
    "RecordExtent",
    "RecordLocation",
    "ShardClosed",
    "ShardError",
    "ShardIOError",
    "ShardLocked",
    "ShardStats",
]


class _Segment:
    __slots__ = ("fd", "handle", "index", "keys", "path", "size")

    def __init__(self, index: int, path: Path, fd: int, handle: Any, size: int) -> None:
        self.index, self.path, self.fd, self.handle, self.size = index, path, fd, handle, size
        self.keys: set[bytes] = set()  # every key with a record or tombstone in this file


class NvmeShard:
    """One shard directory; ``put``/``get``/``delete`` by opaque key, ``compact`` retired space."""

    def __init__(self, directory: str | os.PathLike[str], config: NvmeShardConfig | None = None):
        self.config = config or NvmeShardConfig()
        self.path = Path(directory)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._lock_fd = lock_directory(self.path)
        try:
            self._io = open_engine(self.config)
        except BaseException:
            os.close(self._lock_fd)
            raise
        # The header block of every append; bytes past the longest key are never written.
        self._header_view = memoryview(
            bytearray(fmt.header_block(fmt.MAX_KEY_BYTES, self.config.align))
        )
        self._key_end = 0  # where the key last packed into it ends
        self._segments: dict[int, _Segment] = {}
        self._active_seg: _Segment  # the newest segment, set by _new_segment
        self._index: dict[bytes, RecordLocation] = {}
        self._tombs: dict[bytes, tuple[int, int]] = {}  # key -> (seq, segment)
        self._live: dict[int, int] = {}  # segment -> live record bytes
        self._next_seq = 1
        self._unsynced = 0
        self._corrupt = 0
        self._syncs = 0
        self._free_estimate = 0  # bytes the file system had free, less what we wrote since
        self._closed = False
        try:
            rebuild_index(self)
        except BaseException:
            self._release()  # no descriptors or lock left behind by a failed open
            raise

    # ---------------------------------------------------------------- public API
    def put(self, key: bytes, data: Any, generation: int) -> RecordLocation:
        """Append ``data`` under ``key``; published only once fully written."""
        check_key(key)
        if not isinstance(generation, int) or generation < 0:
            raise InvalidRecord(f"generation must be a non-negative int, got {generation!r}")
        payload = as_bytes_view(data)
        if payload.nbytes > self.config.max_record_bytes:
            raise InvalidRecord(
                f"payload of {payload.nbytes} B exceeds max_record_bytes "
                f"{self.config.max_record_bytes}"
            )
        with self._lock:
            self._check_open()
            seq = self._next_seq
            loc = self._append(key, payload, generation, seq, 0)
            self._next_seq += 1
            self._publish(key, loc)
            return loc

    def get(self, key: bytes, out: Any = None) -> bytes | memoryview | Lookup:
        """The payload (bytes, or a view of ``out`` when given), or ``Lookup.MISS``.

        A record whose checksum fails or whose bytes are gone is a miss, and is
        dropped from the index.
        """
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return Lookup.MISS
            view = self._read_payload(loc, out)
            if view is None:
                self._corrupt += 1
                self._unpublish(key)
                return Lookup.MISS
            return view if out is not None else bytes(view)

    def _find(self, key: bytes) -> RecordLocation | None:
        """The published record of a valid ``key`` on an open shard (caller holds the lock)."""
        check_key(key)
        self._check_open()
        return self._index.get(key)

    def locate(self, key: bytes) -> tuple[Lookup, RecordLocation | None]:
        with self._lock:
            loc = self._index.get(key)
        return (Lookup.HIT, loc) if loc is not None else (Lookup.MISS, None)

    def delete(self, key: bytes) -> Lookup:
        """Retire ``key`` (a tombstone makes it survive restarts); HIT if it existed."""
        check_key(key)
        with self._lock:
            self._check_open()
            if key not in self._index:
                return Lookup.MISS
            seq = self._next_seq
            loc = self._append(key, memoryview(b""), 0, seq, fmt.FLAG_TOMBSTONE)
            self._next_seq += 1
            self._unpublish(key)
            self._tombs[key] = (seq, loc.segment)
            return Lookup.HIT

    def shred(self, key: bytes) -> Lookup:
        """Erasure: overwrite ``key``'s payload with zeros where it lies (and sync), then
        retire it like ``delete``; HIT if it existed. The record header (key, length,
        checksum) stays so recovery still parses the segment; the tombstone hides it."""
        check_key(key)
        with self._lock:
            self._check_open()
            loc = self._index.get(key)
            if loc is None:
                return Lookup.MISS
            seg = self._segments[loc.segment]
            _zero_range(seg.fd, loc.payload_offset, loc.length)
            self._fsync(seg.fd)
        return self.delete(key)

    def shred_dead(self) -> int:
        """Erasure: zero the payload of every record that is no longer live (deleted or
        superseded: appends leave the old bytes in place), and sync; returns how many
        were zeroed. Reads every segment's headers: an erasure-time sweep, not a hot path."""
        zeroed = 0
        with self._lock:
            self._check_open()
            live = {(loc.segment, loc.offset) for loc in self._index.values()}
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

    def drop_cache(self, key: bytes) -> Lookup:
        """Drop ``key``'s record (header and payload) from the page cache; HIT if it exists.

        The next ``get`` then reads the device. Pages not yet written back stay cached
        (the kernel only starts their writeback): ``sync()`` first to drop them all.
        """
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return Lookup.MISS
            drop_range(self._segments[loc.segment].fd, loc.offset, _record_bytes(loc))
            return Lookup.HIT

    def extent(self, key: bytes) -> RecordExtent | None:
        """Where ``key``'s record lies on disk (its segment file and byte range), or None."""
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return None
            return RecordExtent(path=self._segments[loc.segment].path, offset=loc.offset,
                                length=_record_bytes(loc), payload_offset=loc.payload_offset,
                                payload_length=loc.length)

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def stats(self) -> ShardStats:
        with self._lock:
            return ShardStats(
                records=len(self._index),
                segments=len(self._segments),
                file_bytes=sum(s.size for s in self._segments.values()),
                live_bytes=sum(self._live.values()),
                corrupt_records=self._corrupt,
                syncs=self._syncs,
                engine=self._io.name,
            )

    def sync(self) -> None:
        with self._lock:
            self._check_open()
            self._sync_active()

    def compact(self, min_dead_ratio: float = 0.5) -> CompactionReport:
        with self._lock:
            self._check_open()
            return compact_segments(self, min_dead_ratio)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self.config.fsync is not FsyncPolicy.NONE:
                self._sync_active()
            self._release()

    def _release(self) -> None:
        self._io.close()  # drops every registration (and helper thread), then the files can go
        for seg in self._segments.values():
            os.close(seg.fd)
        os.close(self._lock_fd)
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- writing
    def _active(self, need: int) -> _Segment:
        active = self._active_seg
        if active.size and active.size + need > self.config.segment_bytes:
            if self.config.fsync is not FsyncPolicy.NONE:
                self._sync_active()
            active = self._new_segment(active.index + 1)
        return active

    def _check_space(self, need: int, tombstone: bool) -> None:
        # Tombstones (one header block) are exempt from the quota: a full shard must still
        # be able to retire records, or it could never make room again.
        quota = self.config.max_bytes
        if quota is not None and not tombstone:
            total = sum(s.size for s in self._segments.values())
            if total + need > quota:
                raise DiskFull(f"shard quota {quota} B: {total} B used, record needs {need} B")
        # statvfs only when the running estimate nears the need; a write that still finds
        # the disk full is rolled back the same way.
        if self._free_estimate < need + _FREE_MARGIN:
            self._free_estimate = free_bytes(self.path)
            if self._free_estimate < need:
                raise DiskFull(f"file system of {self.path} has less than {need} B free")
        self._free_estimate -= need

    def _append(
        self, key: bytes, payload: memoryview, generation: int, seq: int, flags: int
    ) -> RecordLocation:
        align = self.config.align
        key_end = fmt.HEADER.size + len(key)
        block = fmt.header_block(len(key), align)
        n = payload.nbytes
        # One hash for a payload up to a stripe (most records); payload_digest stripes the rest.
        digest = fmt.checksum(payload) if n <= fmt.STRIPE_BYTES else fmt.payload_digest(payload)
        seg = self._active(fmt.round_up(block + n, align))
        offset = fmt.round_up(seg.size, align)
        self._check_space(offset - seg.size + block + n, bool(flags & fmt.FLAG_TOMBSTONE))
        header = self._header_view
        if key_end < self._key_end:  # zero the tail of a longer key written before
            header[key_end : self._key_end] = _ZEROS[: self._key_end - key_end]
        self._key_end = key_end
        fmt.pack_fields_into(header, flags, key, generation, n, seq, digest)
        self._write(seg, offset, header[:block], payload)
        seg.size = offset + block + n
        seg.keys.add(key)
        self._after_write(seg)
        return RecordLocation(
            seg.index, offset, offset + block, n, generation, seq, digest, fmt.FORMAT_VERSION
        )

    def _write(self, seg: _Segment, offset: int, header: memoryview, payload: memoryview) -> None:
        """Header block + payload at ``offset``; on failure nothing of the record stays."""
        try:
            self._io.write(seg.handle, offset, header, payload)
        except OSError as exc:
            os.ftruncate(seg.fd, seg.size)  # roll back
            self._free_estimate = 0  # look at the file system again next time
            need = header.nbytes + payload.nbytes
            if exc.errno in _FULL_ERRNOS or free_bytes(self.path) < need:
                raise DiskFull(f"writing {need} B to {seg.path} failed: {exc}") from exc
            raise ShardIOError(f"writing to {seg.path} failed: {exc}") from exc

    def _after_write(self, seg: _Segment) -> None:
        policy = self.config.fsync
        self._unsynced += 1
        if policy is FsyncPolicy.EVERY_RECORD or (
            policy is FsyncPolicy.EVERY_N and self._unsynced >= self.config.fsync_every_n
        ):
            self._fsync(seg.fd)
            self._unsynced = 0

    def _sync_active(self) -> None:
        if self._segments and self._unsynced:
            self._fsync(self._active_seg.fd)
        self._unsynced = 0

    def _fsync(self, fd: int) -> None:
        os.fsync(fd)
        self._syncs += 1

    def _publish(self, key: bytes, loc: RecordLocation) -> None:
        self._unpublish(key)
        self._index[key] = loc
        self._live[loc.segment] = self._live.get(loc.segment, 0) + _record_bytes(loc)

    def _unpublish(self, key: bytes) -> None:
        old = self._index.pop(key, None)
        if old is not None:
            self._live[old.segment] -= _record_bytes(old)

    # ---------------------------------------------------------------- reading
    def _read_payload(self, loc: RecordLocation, out: Any) -> memoryview | None:
        """The verified payload (in ``out`` or the engine's buffer), None if bad or gone."""
        if loc.length == 0:
            return memoryview(b"") if loc.checksum == fmt.checksum(b"") else None
        seg = self._segments[loc.segment]
        return self._io.read(seg.handle, loc, out)

    # ---------------------------------------------------------------- recovery
    def _new_segment(self, index: int) -> _Segment:
        path = self.path / f"seg-{index:08d}.akv"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if self.config.fsync is not FsyncPolicy.NONE:
            fsync_dir(self.path)
        size = os.fstat(fd).st_size
        try:
            handle = self._io.attach(fd)
        except BaseException:
            os.close(fd)
            raise
        seg = _Segment(index, path, fd, handle, size)
        self._segments[index] = seg
        self._active_seg = seg  # indices only grow: the newest segment is the active one
        self._live.setdefault(index, 0)
        return seg

    def _check_open(self) -> None:
        if self._closed:
            raise ShardClosed(f"shard {self.path} is closed")


def _zero_range(fd: int, offset: int, length: int) -> bool:
    """Overwrite ``length`` bytes at ``offset`` with zeros unless they are zero already;
    True if it wrote."""
    chunk = 1 << 20
    wrote = False
    end = offset + length
    while offset < end:
        n = min(chunk, end - offset)
        if os.pread(fd, n, offset).count(0) != n:
            os.pwrite(fd, bytes(n), offset)
            wrote = True
        offset += n
    return wrote


def _record_bytes(loc: RecordLocation) -> int:
    return loc.payload_offset - loc.offset + loc.length
