"""Host pool: a slab of fixed-size page slots in one /dev/shm segment shared by processes.

Segment layout (all offsets 4 KiB aligned)::

    [header 4 KiB][slot table: num_slots x 64 B][data: num_slots x slot_bytes]

A slot-table row is eight uint64: seq, version, length, state, writer_pid, data_offset and
two spare words. ``seq`` is a seqlock: the writer makes it odd, copies, publishes
length/version, makes it even again. A reader copies between two reads of ``seq`` and
retries when they differ, so it returns a whole old page or a whole new page, never a mix
(``view`` skips the copy: the caller uses the bytes in place, then asks ``unchanged``). A
writer that dies mid-copy leaves ``seq`` odd: readers report TornRead, and the next writer
to attach turns such slots into empty ones. x86-64 keeps stores in program order, which
this protocol relies on (ARM would need explicit fences).

One writer (an exclusive flock on the segment, dropped by the kernel if the
writer dies) and any number of readers; the segment itself (create, attach, the
writer lock, unlink) is ``store.shm_segment``.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections import deque
from collections.abc import Iterator
from typing import Self

import numpy as np

from store import forks
from store import shm_segment as shm
from store.host_pool_types import (
    EmptyPage,
    NotWriter,
    PoolBusy,
    PoolForked,
    PoolFormatError,
    PoolFull,
    PoolStats,
    SlotEmpty,
    TornRead,
)
from store.parallel import as_bytes, copy_into, tensor_over
from store.shm_segment import SHM_DIR, ShmSegment
from store.types import PageTooLarge, PoolError

__all__ = ["PAGE_BYTES", "SHM_DIR", "EmptyPage", "HostPool", "NotWriter", "PageTooLarge", "PoolBusy",
           "PoolError", "PoolForked", "PoolFormatError", "PoolFull", "PoolStats", "SlotEmpty",
           "TornRead"]

PAGE_BYTES = 4096  # slot sizes are rounded up to it; table and data start on it
MAGIC = b"AKVHPOOL"  # a segment starts with it (store.kv replaces one a dead writer left)
_VERSION = 1
# magic, version, row_bytes, slot_bytes, num_slots, table, data, size
_HEAD = struct.Struct("<8sIIQQQQQ")
_ROW = 8  # uint64 words per slot row (64 B: one cache line)
SEQ, VER, LEN, STATE, PID, OFF = range(6)
_FREE, _USED = 0, 1
_READ_RETRIES = 10_000
_REGIONS_MAX = 4096  # slot regions (array and tensor) kept for the copies, at most


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class HostPool:
    """Use :meth:`create` (writer) or :meth:`attach` (reader, or writer after a crash)."""

    def __init__(self, segment: ShmSegment) -> None:
        self.name, self.writer = segment.name, segment.writer
        self._segment, self._mm = segment, segment.mm
        mm = segment.mm
        magic, version, row_bytes, slot_bytes, num_slots, table_off, _data_off, size = (
            _HEAD.unpack_from(mm)
        )
        if magic != MAGIC or version != _VERSION or row_bytes != _ROW * 8 or size != len(mm):
            segment.close()
            raise PoolFormatError(f"{self.name}: not a version-{_VERSION} host pool segment")
        self.slot_bytes, self.num_slots = slot_bytes, num_slots
        self._bytes = np.frombuffer(mm, dtype=np.uint8)
        self._table = np.frombuffer(mm, dtype=np.uint64, count=num_slots * _ROW, offset=table_off)
        self._table = self._table.reshape(num_slots, _ROW)
        # Scalar seqlock words go through a memoryview: ~10x cheaper per access than numpy scalars.
        self._words = memoryview(mm)[table_off : table_off + num_slots * _ROW * 8].cast("Q")
        self._pid, self._opened = os.getpid(), forks.generation()
        self._free: deque[int] = deque()
        # slot -> (length, array, tensor) over the slot's first ``length`` bytes: a put or
        # get of the same slot and length copies through them without making new ones.
        self._regions: dict[int, tuple[int, np.ndarray, object]] = {}
        if self.writer:
            self._recover()

    @classmethod
    def create(cls, name: str, slot_bytes: int, num_slots: int) -> HostPool:
        """Create, size and pre-fault a new segment and become its writer."""
        if slot_bytes <= 0 or num_slots <= 0:
            raise ValueError(f"slot_bytes and num_slots must be positive, got {slot_bytes}, "
                             f"{num_slots}")
        slot_bytes = _round_up(slot_bytes, PAGE_BYTES)
        table_off = PAGE_BYTES
        data_off = _round_up(table_off + num_slots * _ROW * 8, PAGE_BYTES)
        size = data_off + slot_bytes * num_slots

        def init(mm: mmap.mmap) -> None:
            _HEAD.pack_into(mm, 0, MAGIC, _VERSION, _ROW * 8, slot_bytes, num_slots, table_off,
                            data_off, size)
            table = np.frombuffer(mm, dtype=np.uint64, count=num_slots * _ROW, offset=table_off)
            offsets = data_off + np.arange(num_slots, dtype=np.uint64) * slot_bytes
            table.reshape(num_slots, _ROW)[:, OFF] = offsets

        try:
            return cls(ShmSegment.create(name, size, init))
        except shm.SegmentNoSpace as exc:
            raise PoolFull(f"/dev/shm cannot hold a {size}-byte pool: {exc}") from exc

    @classmethod
    def attach(cls, name: str, *, writer: bool = False) -> HostPool:
        """Map an existing segment. ``writer=True`` takes over the writer role (after a crash)."""
        try:
            segment = ShmSegment.attach(name, writer=writer, min_size=_HEAD.size)
        except shm.SegmentBusy as exc:
            raise PoolBusy(str(exc)) from exc
        except shm.SegmentTooSmall as exc:
            raise PoolFormatError(str(exc)) from exc
        return cls(segment)

    def _recover(self) -> None:
        """Writer start-up: rebuild the free queue; empty any slot a dead writer left mid-write."""
        torn = (self._table[:, SEQ] & np.uint64(1)) == 1
        for slot in np.flatnonzero(torn):
            self._table[slot, LEN] = 0
            self._table[slot, SEQ] += np.uint64(1)
        free = np.flatnonzero(self._table[:, STATE] == _FREE)
        self._free = deque(int(s) for s in free)

    # -- writer ---------------------------------------------------------------
    def alloc(self) -> int:
        self._need_writer()
        if not self._free:
            raise PoolFull(
                f"{self.name}: all {self.num_slots} slots of {self.slot_bytes} B are in use"
            )
        slot = self._free.popleft()
        base = slot * _ROW
        self._words[base + LEN] = 0
        self._words[base + STATE] = _USED
        return slot

    def write(self, slot: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Replace the slot's page with ``data``; returns the slot's new version."""
        if not self.writer or forks.forked_since(self._opened):
            self._need_writer()
        w, base = self._words, self._base(slot)
        src = as_bytes(data)
        n = src.shape[0]
        if n > self.slot_bytes:
            raise PageTooLarge(f"{n} bytes do not fit a {self.slot_bytes}-byte slot")
        if n == 0:
            raise EmptyPage(f"{self.name}: refusing to write an empty page to slot {slot}")
        if w[base + STATE] != _USED:
            raise SlotEmpty(f"{self.name}: slot {slot} is not allocated")
        seq, version = base + SEQ, w[base + VER] + 1
        region = self._region(slot, n)
        w[base + PID] = self._pid
        w[seq] += 1  # odd: writing
        copy_into(region[1], src, dst_tensor=region[2])  # large pages: on every core
        w[base + LEN] = n
        w[base + VER] = version
        w[seq] += 1  # even: published
        return version

    def reserve(self, slot: int, n: int) -> np.ndarray:
        """Start writing ``n`` bytes into ``slot`` in place: returns a writable view of them.

        Readers of the slot wait (as for ``write``) until :meth:`commit` publishes the page
        or :meth:`abort` leaves the slot empty. For producers that build a page straight
        into the pool (sealing into the slot, a decoder writing its output): no copy."""
        self._need_writer()
        w, base = self._words, self._base(slot)
        if n > self.slot_bytes:
            raise PageTooLarge(f"{n} bytes do not fit a {self.slot_bytes}-byte slot")
        if n <= 0:
            raise EmptyPage(f"{self.name}: refusing to reserve an empty page in slot {slot}")
        if w[base + STATE] != _USED:
            raise SlotEmpty(f"{self.name}: slot {slot} is not allocated")
        if w[base + SEQ] & 1:
            raise PoolError(f"{self.name}: slot {slot} is already reserved")
        off = w[base + OFF]
        w[base + PID] = self._pid
        w[base + SEQ] += 1  # odd: writing
        w[base + LEN] = n  # what commit may publish (readers trust LEN only at an even SEQ)
        return self._bytes[off : off + n]

    def commit(self, slot: int, n: int) -> int:
        """Publish the first ``n`` reserved bytes of ``slot``; returns its new version."""
        self._need_writer()
        w, base = self._words, self._base(slot)
        if not w[base + SEQ] & 1:
            raise PoolError(f"{self.name}: slot {slot} is not reserved")
        if not 0 < n <= w[base + LEN]:  # past the reservation: bytes nobody wrote
            raise PageTooLarge(f"{n} bytes exceed the {w[base + LEN]} reserved in slot {slot}")
        w[base + LEN] = n
        w[base + VER] += 1
        w[base + SEQ] += 1  # even: published
        return w[base + VER]

    def abort(self, slot: int) -> None:
        """Give up a reservation: the slot stays allocated and holds no page."""
        self._need_writer()
        w, base = self._words, self._base(slot)
        if not w[base + SEQ] & 1:
            raise PoolError(f"{self.name}: slot {slot} is not reserved")
        w[base + LEN] = 0
        w[base + SEQ] += 1

    def free(self, slot: int, *, scrub: bool = False) -> None:
        """Return the slot; ``scrub=True`` also zeroes its bytes (erasure, not just release)."""
        self._need_writer()
        w, base = self._words, self._base(slot)
        if w[base + STATE] != _USED:
            raise SlotEmpty(f"{self.name}: slot {slot} is not allocated")
        w[base + SEQ] += 1
        w[base + STATE] = _FREE
        w[base + LEN] = 0
        if scrub:
            off = w[base + OFF]
            self._bytes[off : off + self.slot_bytes] = 0
        w[base + SEQ] += 1  # a reader mid-copy sees seq move and retries
        self._free.append(slot)

    def scrub_free(self) -> int:
        """Zero the data of every free slot (erasure: a slot freed without ``scrub`` keeps
        its last record until reused); returns how many slots were zeroed. Writer only."""
        self._need_writer()
        free = np.flatnonzero(self._table[:, STATE] == _FREE)
        for slot in free:
            off = int(self._table[slot, OFF])
            self._bytes[off : off + self.slot_bytes] = 0
        return int(free.size)

    # -- readers (and the writer) ---------------------------------------------
    def read(
        self, slot: int, out: bytearray | memoryview | np.ndarray | None = None
    ) -> memoryview | bytes:
        """A consistent copy of the slot's page: into ``out`` (returns a view of it) or bytes."""
        return self.read_versioned(slot, out)[0]

    def read_versioned(self, slot: int, out=None) -> tuple[memoryview | bytes, int]:
        """Like :meth:`read`, also returning the version the copy belongs to."""
        dst = None if out is None else as_bytes(out)
        w, base = self._words, self._base(slot)
        seq = w[base + SEQ]  # a first attempt without the retries' generator (most reads)
        if not seq & 1:
            n, version, off = w[base + LEN], w[base + VER], w[base + OFF]
            if n and w[base + STATE] == _USED:
                data = self._copy_out(slot, n, off, dst)
                if w[base + SEQ] == seq:
                    return data, version
        for seq, n, version, off in self._stable_reads(slot):
            data = self._copy_out(slot, n, off, dst)
            if w[base + SEQ] == seq:
                return data, version
        raise self._kept_changing(slot)

    def _copy_out(self, slot: int, n: int, off: int, dst: np.ndarray | None
                  ) -> memoryview | bytes:
        """One attempt's copy of the slot's ``n`` bytes at ``off``: into ``dst``, or bytes."""
        if dst is None:
            return self._mm[off : off + n]  # one copy straight into a new bytes object
        if dst.nbytes < n:
            raise ValueError(f"out holds {dst.nbytes} bytes, page is {n}")
        if dst.shape[0] != n:
            dst = dst[:n]
        region = self._region(slot, n)
        copy_into(dst, region[1], src_tensor=region[2])
        return memoryview(dst)

    def _region(self, slot: int, n: int) -> tuple[int, np.ndarray, object]:
        """The slot's first ``n`` bytes as an array and a tensor (``tensor_over``), kept."""
        region = self._regions.get(slot)
        if region is None or region[0] != n:
            if len(self._regions) >= _REGIONS_MAX:
                self._regions.clear()
            off = self._words[slot * _ROW + OFF]
            part = self._bytes[off : off + n]
            region = self._regions[slot] = (n, part, tensor_over(part))
        return region

    def view(self, slot: int) -> tuple[memoryview, int]:
        """Zero-copy read: a read-only view of the slot's page and the ``seq`` it was taken at.

        The bytes may change under the caller (the writer is not held off), so whatever is
        read from the view counts only if :meth:`unchanged` (slot, seq) holds afterwards.
        """
        for seq, n, _version, off in self._stable_reads(slot):
            page = memoryview(self._mm)[off : off + n].toreadonly()
            if self.unchanged(slot, seq):
                return page, seq
            page.release()
        raise self._kept_changing(slot)

    def _stable_reads(self, slot: int) -> Iterator[tuple[int, int, int, int]]:
        """The seqlock reader's attempts: (seq, length, version, offset) of a slot that is
        not mid-write and holds a page. The caller reads, then keeps the result only if
        :meth:`unchanged` (slot, seq), and raises ``_kept_changing`` when they run out.
        SlotEmpty for a slot that stays empty; TornRead when its writer died mid-write."""
        w, base = self._words, self._base(slot)
        for attempt in range(_READ_RETRIES):
            seq = w[base + SEQ]
            if seq & 1:
                self._writer_busy(slot, attempt)
                continue
            n, version, off = w[base + LEN], w[base + VER], w[base + OFF]
            if w[base + STATE] != _USED or n == 0:
                if w[base + SEQ] == seq:
                    raise SlotEmpty(f"{self.name}: slot {slot} holds no page")
                continue
            yield seq, n, version, off

    def _kept_changing(self, slot: int) -> TornRead:
        return TornRead(f"{self.name}: slot {slot} changed on every one of {_READ_RETRIES} attempts")

    def unchanged(self, slot: int, seq: int) -> bool:
        """Whether no write or free touched ``slot`` since :meth:`view` returned ``seq``."""
        return self._words[self._base(slot) + SEQ] == seq

    def slots(self, *, empty: bool = False) -> Iterator[tuple[int, int, int]]:
        """(slot, version, length) of each allocated slot holding a page, or none (``empty``)."""
        full = self._table[:, LEN] > 0
        held = np.flatnonzero((self._table[:, STATE] == _USED) & (~full if empty else full))
        for slot in held:
            row = self._table[slot]
            yield int(slot), int(row[VER]), int(row[LEN])

    @property
    def buffer(self) -> np.ndarray:
        """The whole mapped segment as uint8, for one transport registration (e.g. NIXL)."""
        return self._bytes

    def slot_offset(self, slot: int) -> int:
        """Byte offset of ``slot``'s data inside the segment (and :attr:`buffer`)."""
        return self._words[self._base(slot) + OFF]

    def stats(self) -> PoolStats:
        used = self._table[:, STATE] == _USED
        return PoolStats(name=self.name, slot_bytes=self.slot_bytes, num_slots=self.num_slots,
                         used_slots=int(used.sum()), used_bytes=int(self._table[used, LEN].sum()))

    def close(self) -> None:
        """Unmap and drop the writer lock; the segment stays for other processes."""
        if self._mm is None:
            return
        self._regions.clear()  # their arrays and tensors hold the mapping
        self._words.release()
        del self._bytes, self._table, self._words
        self._segment.close()  # a caller may still hold `buffer`: then unmapped on GC
        self._mm = None

    def unlink(self) -> None:
        """Remove the segment name (mappings stay valid until each process closes)."""
        self._segment.unlink()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _base(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise SlotEmpty(f"{self.name}: slot {slot} is out of range [0, {self.num_slots})")
        return slot * _ROW

    def _writer_busy(self, slot: int, attempt: int) -> None:
        """A reader found ``slot`` mid-write: wait a little, or give up if its writer died."""
        if not shm.pid_alive(self._words[self._base(slot) + PID]):
            raise TornRead(f"{self.name}: slot {slot}'s writer died mid-write")
        time.sleep(0 if attempt < 100 else 0.0001)

    def _need_writer(self) -> None:
        if not self.writer:
            raise NotWriter(f"{self.name}: this handle is a reader")
        if forks.forked_since(self._opened):
            raise PoolForked(f"{self.name}: the writer is process {self._pid}, not its child")
