"""NvmeShard: append-only segment files with checksummed records and crash recovery.

The shard composes two collaborators and holds the one lock that serialises callers:
``SegmentFiles`` (``store.nvme.segments``: the directory, its lock, the file engine, the
bytes) and ``RecordIndex`` (``store.nvme.index``: which record of each key is live). Bytes
move through a file engine (``store.nvme.engines``: direct syscalls by default, or NIXL
POSIX jobs); every read is verified against the record's payload hash. A record is
published in the index only after all of its bytes are written (and synced, per policy);
a failed write is truncated away, so a full disk leaves the shard as it was. Tombstones
and compaction's copies draw on a small space reserve (``store.nvme.reserve``) when the
file system is full, so a full disk still deletes, shreds and compacts. A put that finds the
quota or the file system full first compacts retired space (``_reclaim``), then fails with
``DiskFull`` and changes nothing; when the file system refuses the next segment file (out
of inodes or space) that is ``SegmentNotCreated``, while tombstones and compaction's copies
go to the active segment past ``segment_bytes``. One process owns a directory (flock).

Maintenance lives here as methods: recovery on open (every segment scanned; the newest
sequence number of a key wins, a tombstone hides older records, a torn tail of the last
segment is cut), compaction (live records copied forward with their sequence numbers, so
a crash half-way leaves duplicates that recovery resolves to the same record; the copies
are synced before the old files go, whatever the fsync policy), erasure (``shred``,
``shred_dead``), ``prune`` (drop records a caller can no longer use, such as those sealed
under an erased key) and page-cache eviction (``drop_cache``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from store import forks
from store.nvme import format as fmt
from store.nvme.files import as_bytes_view, check_key, unavailable
from store.nvme.index import RecordIndex
from store.nvme.segments import SegmentFiles
from store.nvme.types import (
    CompactionReport,
    DiskFull,
    FsyncPolicy,
    InvalidRecord,
    NvmeShardConfig,
    QuotaFull,
    RecordExtent,
    RecordLocation,
    SegmentNotCreated,
    ShardClosed,
    ShardError,
    ShardForked,
    ShardStats,
)
from store.types import Lookup

_EMPTY = memoryview(b"")


class NvmeShard:
    """One shard directory; ``put``/``get``/``delete`` by opaque key, ``compact`` retired space."""

    def __init__(self, directory: str | os.PathLike[str], config: NvmeShardConfig | None = None):
        self.config = config or NvmeShardConfig()
        # Absolute from the start: a relative path would follow a later chdir, and new
        # segment files would land in another directory (lost at the next open).
        self.path = Path(directory).absolute()
        self._pid, self._opened = os.getpid(), forks.generation()
        self._lock = threading.Lock()
        try:
            self._files = SegmentFiles(self.path, self.config)
        except ShardError:
            raise
        except OSError as exc:
            raise unavailable(self.path, exc) from exc
        self._index = RecordIndex()
        self._corrupt = 0
        self._closed = False
        try:
            self._files.load(self._index.recover)
            self._index.finish_recovery()
        except BaseException as exc:
            self._files.close()  # no descriptors or lock left behind by a failed open
            self._closed = True
            if isinstance(exc, OSError) and not isinstance(exc, ShardError):
                raise unavailable(self.path, exc) from exc
            raise

    # ---------------------------------------------------------------- records
    def put(self, key: bytes, data: Any, generation: int) -> RecordLocation:
        """Append ``data`` under ``key``; published only once fully written."""
        check_key(key)
        if not isinstance(generation, int) or generation < 0:
            raise InvalidRecord(f"generation must be a non-negative int, got {generation!r}")
        payload = as_bytes_view(data)
        if payload.nbytes > self.config.max_record_bytes:
            raise InvalidRecord(f"payload of {payload.nbytes} B exceeds max_record_bytes "
                                f"{self.config.max_record_bytes}")
        with self._lock:
            self._check_open()
            try:
                loc = self._files.append(key, payload, generation, self._index.take_seq())
            except DiskFull as full:  # over the quota, or the file system is full
                if not (self.config.compact_on_full and self._reclaim(*self._shortfall(
                        full, fmt.header_block(len(key), self.config.align) + payload.nbytes))):
                    raise
                loc = self._files.append(key, payload, generation, self._index.take_seq())
            self._index.advance_seq()
            self._index.publish(key, loc)
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
            view = self._files.read(loc, out)
            if view is None:
                self._drop_corrupt(key)
                return Lookup.MISS
            return view if out is not None else bytes(view)

    def _drop_corrupt(self, key: bytes) -> None:
        """A record that failed verification goes as a delete does, with a tombstone: out
        of the index only, an older record of the key in another segment came back at the
        next recovery, once compaction had removed the damaged one (caller holds the lock)."""
        self._corrupt += 1
        try:
            self._retire(key)
        except DiskFull:  # no room even for a tombstone: at least it is not served now
            self._index.unpublish(key)

    def locate(self, key: bytes) -> tuple[Lookup, RecordLocation | None]:
        with self._lock:
            loc = self._index.get(key)
        return (Lookup.HIT, loc) if loc is not None else (Lookup.MISS, None)

    def read_head(self, key: bytes, out: memoryview) -> memoryview | Lookup:
        """The first bytes of ``key``'s payload, read into ``out`` (as many as fit; not
        verified against the payload hash, which covers the whole payload): a view of
        ``out``, or MISS when there is no such record or they cannot be read. Nothing
        changes (unlike ``get``, an unreadable record stays indexed)."""
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return Lookup.MISS
            head = out[: min(out.nbytes, loc.length)]
            return head if self._files.read_range(loc, head, 0) else Lookup.MISS

    def delete(self, key: bytes) -> Lookup:
        """Retire ``key`` (a tombstone makes it survive restarts); HIT if it existed."""
        check_key(key)
        with self._lock:
            self._check_open()
            return self._retire(key)

    def _retire(self, key: bytes) -> Lookup:
        if key not in self._index:
            return Lookup.MISS
        seq = self._index.take_seq()
        try:  # on a full file system the tombstone draws on the space reserve
            loc = self._files.append(key, _EMPTY, 0, seq, fmt.FLAG_TOMBSTONE)
        except DiskFull:  # and that is spent: free the segments nothing live is left in
            if not self._drop_dead_segments():
                raise
            loc = self._files.append(key, _EMPTY, 0, seq, fmt.FLAG_TOMBSTONE)
        self._index.advance_seq()
        self._index.retire(key, seq, loc.segment)
        return Lookup.HIT

    def _find(self, key: bytes) -> RecordLocation | None:
        """The published record of a valid ``key`` on an open shard (caller holds the lock)."""
        check_key(key)
        self._check_open()
        return self._index.get(key)

    def keys(self) -> list[bytes]:
        with self._lock:
            return self._index.keys()

    def __len__(self) -> int:
        return len(self._index)

    # ---------------------------------------------------------------- erasure
    def shred(self, key: bytes) -> Lookup:
        """Erasure: overwrite ``key``'s payload with zeros where it lies (and sync), then
        retire it like ``delete``; HIT if it existed. The record header (key, length,
        checksum) stays so recovery still parses the segment; the tombstone hides it.
        If the tombstone cannot be written (the disk and its reserve are full), the key
        still leaves the index (its bytes are zeros now: nothing may serve or count them)
        and the error is raised; a later shred or delete of the key after a restart, which
        finds the zeroed record again, writes the tombstone then."""
        check_key(key)
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return Lookup.MISS
            self._files.zero_payload(loc)
            try:
                return self._retire(key)
            except BaseException:
                self._index.unpublish(key)
                raise

    def shred_dead(self) -> int:
        """Erasure: zero the payload of every record that is no longer live (deleted or
        superseded: appends leave the old bytes in place), and sync; returns how many
        were zeroed. Reads every segment's headers: an erasure-time sweep, not a hot path."""
        with self._lock:
            self._check_open()
            return self._files.zero_dead(self._index.positions())

    def prune(self, keep: Callable[[bytes, memoryview, int], bool], head_bytes: int) -> int:
        """Retire every record for which ``keep(key, head, length)`` is False, where
        ``head`` holds the first ``head_bytes`` of its payload (fewer for a shorter one; not
        verified against the payload hash, which covers the whole payload) and ``length`` is
        the payload's length. For a restarted owner whose records can become unusable while
        it is down (sealed under a key that was erased since): they leave the index instead
        of failing on every read. Returns how many were retired."""
        buf = memoryview(bytearray(max(head_bytes, 1)))
        retired = 0
        with self._lock:
            self._check_open()
            for key, loc in self._index.items():
                head = buf[: min(head_bytes, loc.length)]
                readable = self._files.read_range(loc, head, 0)
                if not readable or not keep(key, head, loc.length):
                    self._retire(key)
                    retired += 1
        return retired

    # ---------------------------------------------------------------- page cache
    def drop_cache(self, key: bytes) -> Lookup:
        """Drop ``key``'s record (header and payload) from the page cache; HIT if it exists.

        The next ``get`` then reads the device. Pages not yet written back stay cached
        (the kernel only starts their writeback): ``sync()`` first to drop them all.
        """
        with self._lock:
            loc = self._find(key)
            if loc is None:
                return Lookup.MISS
            self._files.drop_cache(loc)
            return Lookup.HIT

    def extent(self, key: bytes) -> RecordExtent | None:
        """Where ``key``'s record lies on disk (its segment file and byte range), or None."""
        with self._lock:
            loc = self._find(key)
            return None if loc is None else self._files.extent(loc)

    # ---------------------------------------------------------------- compaction
    def compact(self, min_dead_ratio: float = 0.5) -> CompactionReport:
        """Rewrite the live records of every segment whose dead share is at least
        ``min_dead_ratio`` into the newest segment, then delete those segments."""
        if not 0.0 < min_dead_ratio <= 1.0:
            raise ValueError(f"min_dead_ratio must be in (0, 1], got {min_dead_ratio}")
        with self._lock:
            self._check_open()
            index = self._index
            return self._compact([
                i for i, size in self._files.sizes().items()
                if size and 1.0 - index.live_bytes(i) / size >= min_dead_ratio
            ])

    def _shortfall(self, full: DiskFull, record: int) -> tuple[int, int | None]:
        """What a put refused with ``full`` needs compaction to free, and the live bytes it
        may copy (None: any, past the quota). On a full file system: what is free, or the
        reserve, which the removed segments give back (a later delete still finds room)."""
        return (full.over, None) if isinstance(full, QuotaFull) else \
            (fmt.round_up(record, self.config.align), self._files.room_for_copies())

    def _reclaim(self, over: int, copy_room: int | None = None) -> bool:
        """Compact the segments with the most retired bytes until at least ``over`` bytes
        are freed, copying at most ``copy_room`` live bytes (see ``_shortfall``); False,
        untouched, if the retired space in the shard would not free that much."""
        dead = sorted(((size - (live := self._index.live_bytes(i)), live, i)
                       for i, size in self._files.sizes().items()), reverse=True)
        victims: list[int] = []
        freed = 0
        for gone, live, i in dead:
            if freed >= over or gone <= 0:
                break
            if copy_room is not None:  # a copy lands at the next block: one more each
                if live + self.config.align > copy_room:
                    continue
                copy_room -= live + self.config.align
            victims.append(i)
            freed += gone
        if freed < over:
            return False
        self._compact(victims)
        return True

    def _drop_dead_segments(self) -> bool:
        """Compact every sealed segment without a live record (nothing to copy; it frees
        space and fills the reserve back), for a tombstone that found the disk full; False
        when there is none."""
        files, index = self._files, self._index
        dead = [i for i, size in files.sizes().items()
                if size and i != files.active_index and not index.live_bytes(i)]
        return bool(dead) and self._compact(dead).segments_removed > 0

    def _compact(self, victims: list[int]) -> CompactionReport:
        """Move ``victims``' live records forward and delete them, one segment at a time:
        its copies are synced before its file goes, and the copies (which pass the quota)
        hold the disk above ``max_bytes`` by at most one segment's live bytes."""
        files, index = self._files, self._index
        if files.active_index in victims:  # seal it: copies must land outside every victim
            try:
                files.seal_active()
            except SegmentNotCreated:  # no new file (out of inodes): the active one stays
                victims = [i for i in victims if i != files.active_index]
        by_segment: dict[int, list[tuple[bytes, RecordLocation]]] = {i: [] for i in victims}
        for key, loc in index.items():
            if loc.segment in by_segment:
                by_segment[loc.segment].append((key, loc))
        moved = dropped = reclaimed = 0
        for i in sorted(victims):
            m, d = self._move_live(by_segment[i])
            moved, dropped = moved + m, dropped + d
            self._carry_tombstones({i})
            files.sync_newest()
            reclaimed += files.remove(i)
            index.forget_segment(i)
        if victims:
            files.fill_reserve()  # space is back: the reserve first
        return CompactionReport(segments_removed=len(victims), bytes_reclaimed=reclaimed,
                                records_moved=moved, records_dropped=dropped)

    def _move_live(self, records: list[tuple[bytes, RecordLocation]]) -> tuple[int, int]:
        moved = dropped = 0
        for key, loc in records:
            view = self._files.read(loc, None)
            if view is None:  # failed verification
                self._drop_corrupt(key)
                dropped += 1
                continue
            # A copy: the read buffer is reused by the next read.
            new = self._files.append(key, memoryview(bytes(view)), loc.generation, loc.seq,
                                     over_quota=True)
            self._index.publish(key, new)
            moved += 1
        return moved, dropped

    def _carry_tombstones(self, victims: set[int]) -> None:
        """Keep a tombstone only while an older record of its key survives elsewhere."""
        for key, seq in self._index.tombstones_in(victims):
            if key not in self._index and self._files.holds(key, victims):
                loc = self._files.append(key, _EMPTY, 0, seq, fmt.FLAG_TOMBSTONE)
                self._index.retire(key, seq, loc.segment)
            else:
                self._index.drop_tombstone(key)

    # ---------------------------------------------------------------- state
    def stats(self) -> ShardStats:
        with self._lock:
            return ShardStats(
                records=len(self._index),
                segments=len(self._files),
                file_bytes=self._files.file_bytes(),
                live_bytes=self._index.live_bytes(),
                corrupt_records=self._corrupt,
                syncs=self._files.syncs,
                engine=self._files.engine,
                reserve_bytes=self._files.reserve_bytes,
                reserve_target_bytes=self._files.reserve_target_bytes,
            )

    def sync(self) -> None:
        with self._lock:
            self._check_open()
            self._files.sync_active()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self.config.fsync is not FsyncPolicy.NONE:
                self._files.sync_active()
            self._files.close()
            self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ShardClosed(f"shard {self.path} is closed")
        if forks.forked_since(self._opened):
            raise ShardForked(f"shard {self.path} is process {self._pid}'s, not its child's")

