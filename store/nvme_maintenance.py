"""Maintenance of NVMe shards: index rebuild on open, and compaction.

Recovery scans every segment; the newest sequence number of a key wins, a
tombstone hides older records, and a torn tail of the last segment is cut.
Compaction copies live records forward and drops retired ones.

Copies keep their original sequence numbers, so a crash half-way leaves
duplicates that recovery resolves to the same record. The copies are synced
before the old files go, whatever the shard's fsync policy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from store import nvme_format as fmt
from store.nvme_types import CompactionReport, FsyncPolicy, RecordLocation

if TYPE_CHECKING:
    from store.nvme import NvmeShard


SEGMENT_GLOB = "seg-*.akv"  # seg-00000012.akv; indices only grow


def rebuild_index(shard: NvmeShard) -> None:
    """Rebuild the index from the segment files: newest sequence number wins."""
    names = sorted(shard.path.glob(SEGMENT_GLOB))
    best: dict[bytes, RecordLocation] = {}
    last_end = 0
    for path in names:
        seg = shard._new_segment(int(path.stem.split("-")[1]))
        last_end = 0
        for rec in fmt.scan_segment(seg.fd, seg.size, shard.config.align):
            h = rec.header
            seg.keys.add(h.key)
            shard._next_seq = max(shard._next_seq, h.seq + 1)
            last_end = rec.end
            if h.is_tombstone:
                if h.seq > shard._tombs.get(h.key, (0, 0))[0]:
                    shard._tombs[h.key] = (h.seq, seg.index)
                continue
            if h.key not in best or best[h.key].seq <= h.seq:
                best[h.key] = RecordLocation(
                    segment=seg.index,
                    offset=rec.offset,
                    payload_offset=rec.payload_offset,
                    length=h.payload_len,
                    generation=h.generation,
                    seq=h.seq,
                    checksum=h.payload_hash,
                    version=h.version,
                )
    if not shard._segments:
        shard._new_segment(0)
    else:  # cut a torn tail so the next append starts on clean ground
        active = shard._segments[max(shard._segments)]
        if active.size > last_end:
            os.ftruncate(active.fd, last_end)
            active.size = last_end
    for key, loc in best.items():
        if loc.seq > shard._tombs.get(key, (0, 0))[0]:
            shard._publish(key, loc)


def compact_segments(shard: NvmeShard, min_dead_ratio: float) -> CompactionReport:
    if not 0.0 < min_dead_ratio <= 1.0:
        raise ValueError(f"min_dead_ratio must be in (0, 1], got {min_dead_ratio}")
    segments = shard._segments
    victims = {
        i
        for i, s in segments.items()
        if s.size and 1.0 - shard._live.get(i, 0) / s.size >= min_dead_ratio
    }
    if not victims:
        return CompactionReport(
            segments_removed=0, bytes_reclaimed=0, records_moved=0, records_dropped=0
        )
    active = max(segments)
    if active in victims:  # seal it: copies must land outside every victim
        if shard.config.fsync is not FsyncPolicy.NONE:
            shard._sync_active()
        shard._new_segment(active + 1)
    moved, dropped = _move_live(shard, victims)
    _carry_tombstones(shard, victims)
    shard._fsync(segments[max(segments)].fd)
    shard._unsynced = 0
    reclaimed = 0
    for index in sorted(victims):
        seg = segments.pop(index)
        shard._live.pop(index, None)
        shard._io.detach(seg.handle)
        os.close(seg.fd)
        seg.path.unlink()
        reclaimed += seg.size
    return CompactionReport(
        segments_removed=len(victims),
        bytes_reclaimed=reclaimed,
        records_moved=moved,
        records_dropped=dropped,
    )


def _move_live(shard: NvmeShard, victims: set[int]) -> tuple[int, int]:
    moved = dropped = 0
    for key, loc in list(shard._index.items()):
        if loc.segment not in victims:
            continue
        view = shard._read_payload(loc, None)
        if view is None:  # failed verification
            shard._unpublish(key)
            shard._corrupt += 1
            dropped += 1
            continue
        # A copy: the read buffer is reused by the next read.
        new = shard._append(key, memoryview(bytes(view)), loc.generation, loc.seq, 0)
        shard._publish(key, new)
        moved += 1
    return moved, dropped


def _carry_tombstones(shard: NvmeShard, victims: set[int]) -> None:
    """Keep a tombstone only while an older record of its key survives elsewhere."""
    survivors = [s for i, s in shard._segments.items() if i not in victims]
    for key, (seq, index) in list(shard._tombs.items()):
        if index not in victims:
            continue
        if key not in shard._index and any(key in s.keys for s in survivors):
            loc = shard._append(key, memoryview(b""), 0, seq, fmt.FLAG_TOMBSTONE)
            shard._tombs[key] = (seq, loc.segment)
        else:
            del shard._tombs[key]
