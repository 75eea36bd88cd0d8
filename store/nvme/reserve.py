"""The space reserve of an NVMe shard: file-system blocks held back so that a shard whose
file system is full can still retire records and compact.

Retiring a record appends a tombstone (one header block), and compaction appends copies
of live records before it removes a segment: both need space, so on a full file system a
shard could neither delete nor erase nor reclaim. The reserve is a ballast: blocks
preallocated (``posix_fallocate``) in the shard's ``LOCK`` file, which the shard owns and
holds open already, so the directory gains no file. Its life:

- **fill** at open, after a compaction removed segments, and whenever the shard re-reads
  the file system's free space for a put and finds room for the reserve's whole deficit
  (the reserve comes before that put; it never takes only part of what it lacks);
- **draw**: a tombstone or compaction copy that finds the file system full gives back
  just enough reserve blocks for itself (its size rounded up to the reserve's unit) and
  is retried once; a put never draws (it fails with ``DiskFull`` as before);
- a draw that the reserve cannot cover changes nothing and the append fails as before
  (a tombstone then has the shard compact the segments no live record is left in, and
  is tried again: see ``NvmeShard._retire``).

Size: ``reserve_tombstones`` tombstones at ``2 * align`` each (a header block, plus up to
one block of padding that aligns it), rounded up to whole file-system blocks: 256 KiB
with the defaults. Not counted in ``max_bytes``: the quota covers segment files only, so
the shard's directory takes up to ``max_bytes`` plus the reserve (plus compaction's
overshoot). Another process writing to the same file system may take blocks a draw gave
back before the tombstone lands; that append then fails with ``DiskFull`` as it would
have without a reserve.
"""

from __future__ import annotations

import os

from store.nvme.format import round_up
from store.nvme.types import NvmeShardConfig


def reserve_target(config: NvmeShardConfig, unit: int) -> int:
    """Bytes the reserve holds when full: ``reserve_tombstones`` worst-case tombstones
    (``2 * align`` each), in whole ``unit``s."""
    return round_up(config.reserve_tombstones * 2 * config.align, unit)


def draw_size(need: int, unit: int, held: int) -> int:
    """Bytes to give back for an append of ``need`` bytes from a reserve holding ``held``:
    ``need`` in whole ``unit``s (all that is held when that is less but still enough), or
    0 when the reserve cannot cover it."""
    if need <= 0 or held < need:
        return 0
    return min(round_up(need, unit), held)


class SpaceReserve:
    """The reserve blocks held in ``fd`` (the shard's open ``LOCK`` file); see the module
    docstring. ``held`` is what the file holds now, ``target`` what it should."""

    def __init__(self, fd: int, config: NvmeShardConfig) -> None:
        self._fd = fd
        self.unit = max(config.align, os.fstatvfs(fd).f_frsize)
        self.target = reserve_target(config, self.unit)
        self.held = 0
        size = os.fstat(fd).st_size
        if size > self.target:  # the setting was lowered: give back the excess
            os.ftruncate(fd, self.target)
            size = self.target
        if size and self._allocate(size):  # blocks of a copied or sparse file made real
            self.held = size

    @property
    def deficit(self) -> int:
        return self.target - self.held

    def fill(self, free: int) -> int:
        """Grow back to ``target`` when ``free`` (the file system's free bytes) has room for
        the whole deficit; returns the bytes taken (0: nothing changed)."""
        missing = self.deficit
        if missing <= 0 or free < missing or not self._allocate(self.target):
            return 0
        self.held = self.target
        return missing

    def draw(self, need: int) -> int:
        """Give ``need`` bytes (rounded up to whole units) back to the file system for an
        append that must not fail; returns the bytes given back (0: too little held,
        nothing changed)."""
        size = draw_size(need, self.unit, self.held)
        if size:
            self.held -= size
            os.ftruncate(self._fd, self.held)
        return size

    def _allocate(self, size: int) -> bool:
        """Preallocate ``[0, size)``; False (the file cut back to ``held``) when the file
        system has no room or refuses (a reserve never fails an open or a put)."""
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError:  # full, or no preallocation here: the shard runs on without it
            os.ftruncate(self._fd, self.held)  # give back whatever it took
            return False
        return True
