"""The record index of an NVMe shard: which record of each key is live, which keys are
retired by a tombstone, how many live bytes each segment holds, and the next sequence
number. Bookkeeping only: no files, no locks (the shard holds its lock around every call).

Recovery feeds every record the segment scan finds to :meth:`RecordIndex.recover` in file
order, then calls :meth:`RecordIndex.finish_recovery`: the newest sequence number of a key
wins, and a tombstone newer than a key's newest record hides it.
"""

from __future__ import annotations

from store.nvme.format import ScannedRecord
from store.nvme.types import RecordLocation


class RecordIndex:
    """Published records by key, tombstones by key, live bytes by segment."""

    def __init__(self) -> None:
        self._index: dict[bytes, RecordLocation] = {}
        self._tombs: dict[bytes, tuple[int, int]] = {}  # key -> (seq, segment)
        self._live: dict[int, int] = {}  # segment -> live record bytes
        self._next_seq = 1
        self._found: dict[bytes, RecordLocation] = {}  # recovery: newest record per key

    # -- lookups ---------------------------------------------------------------------------
    def get(self, key: bytes) -> RecordLocation | None:
        return self._index.get(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> list[bytes]:
        return list(self._index)

    def items(self) -> list[tuple[bytes, RecordLocation]]:
        """A snapshot of (key, location): callers may publish while they walk it."""
        return list(self._index.items())

    def positions(self) -> set[tuple[int, int]]:
        """(segment, offset) of every live record."""
        return {(loc.segment, loc.offset) for loc in self._index.values()}

    def live_bytes(self, segment: int | None = None) -> int:
        """Live record bytes in ``segment``, or in all of them."""
        if segment is None:
            return sum(self._live.values())
        return self._live.get(segment, 0)

    # -- changes ---------------------------------------------------------------------------
    def take_seq(self) -> int:
        """The sequence number of the next append (used once the append succeeded)."""
        return self._next_seq

    def advance_seq(self) -> None:
        self._next_seq += 1

    def forget_segment(self, segment: int) -> None:
        self._live.pop(segment, None)

    def publish(self, key: bytes, loc: RecordLocation) -> None:
        self.unpublish(key)
        self._index[key] = loc
        self._live[loc.segment] = self._live.get(loc.segment, 0) + loc.record_bytes

    def unpublish(self, key: bytes) -> RecordLocation | None:
        old = self._index.pop(key, None)
        if old is not None:
            self._live[old.segment] -= old.record_bytes
        return old

    def retire(self, key: bytes, seq: int, segment: int) -> None:
        """``key``'s tombstone (sequence ``seq``) now lies in ``segment``."""
        self.unpublish(key)
        self._tombs[key] = (seq, segment)

    def tombstones_in(self, segments: set[int]) -> list[tuple[bytes, int]]:
        """(key, seq) of every tombstone that lies in one of ``segments``."""
        return [(key, seq) for key, (seq, seg) in self._tombs.items() if seg in segments]

    def drop_tombstone(self, key: bytes) -> None:
        self._tombs.pop(key, None)

    # -- recovery --------------------------------------------------------------------------
    def recover(self, segment: int, rec: ScannedRecord) -> None:
        """One record found by the scan of ``segment`` (segments in index order)."""
        h = rec.header
        self._next_seq = max(self._next_seq, h.seq + 1)
        if h.is_tombstone:
            if h.seq > self._tombs.get(h.key, (0, 0))[0]:
                self._tombs[h.key] = (h.seq, segment)
            return
        best = self._found.get(h.key)
        if best is None or best.seq <= h.seq:
            self._found[h.key] = RecordLocation(
                segment=segment,
                offset=rec.offset,
                payload_offset=rec.payload_offset,
                length=h.payload_len,
                generation=h.generation,
                seq=h.seq,
                checksum=h.payload_hash,
                version=h.version,
            )

    def finish_recovery(self) -> None:
        """Publish the newest record of every key that no newer tombstone hides."""
        found, self._found = self._found, {}
        for key, loc in found.items():
            if loc.seq > self._tombs.get(key, (0, 0))[0]:
                self.publish(key, loc)
