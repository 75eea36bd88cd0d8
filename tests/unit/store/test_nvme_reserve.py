"""A shard whose file system is full can still delete, shred and compact: tombstones and
compaction's copies draw on the space reserve held in the shard's LOCK file; puts never do.

Before the reserve, ``delete`` and ``shred`` on a full file system raised ``DiskFull``
(the tombstone found no room): an erasure zeroed the payload but left the key indexed, and
a full shard could retire nothing. These tests run everywhere: the shard's one reading of
free space (``store.nvme.segments.free_bytes``) is pointed at a simulated file system of a
fixed capacity whose usage is the real size of the files in the shard directory, so a
draw on the reserve (the LOCK file shrinking) frees exactly what it gives back.
``tests/integration/store/test_nvme_full_fs.py`` does the same on a real full tmpfs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from store.nvme import DiskFull, FsyncPolicy, NvmeShard, NvmeShardConfig, segments
from store.nvme.reserve import draw_size, reserve_target
from store.types import Lookup

BLOCK = 4096
RESERVE = 32 * 2 * BLOCK  # the default: 32 tombstones of 2 * align
PAYLOAD = 100_000
RECORD = 106_496  # a header block and PAYLOAD, up to the next block


class SimulatedDisk:
    """A file system of ``capacity`` bytes holding only the files of one directory. Small
    (16 MiB): the shard re-reads free space before every append below 256 MiB free."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.capacity = 16 << 20

    def used(self) -> int:
        return sum(-(-p.stat().st_size // BLOCK) * BLOCK
                   for p in self.directory.iterdir() if p.is_file())

    def free(self, _path: Path) -> int:
        return max(self.capacity - self.used(), 0)

    def fill(self) -> None:
        """No byte left: the capacity is what the files take now."""
        self.capacity = self.used()


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimulatedDisk:
    sim = SimulatedDisk(tmp_path / "shard")
    monkeypatch.setattr(segments, "free_bytes", sim.free)
    return sim


def _payload(i: int) -> bytes:
    return bytes([65 + i]) * PAYLOAD


def _filled(disk: SimulatedDisk, n: int = 4, **kw: object) -> NvmeShard:
    """A shard holding k0..k{n-1} on a file system with no byte left."""
    shard = NvmeShard(disk.directory, NvmeShardConfig(**kw))  # type: ignore[arg-type]
    for i in range(n):
        shard.put(b"k%d" % i, _payload(i), 1)
    disk.fill()
    return shard


def _raw_payload(shard: NvmeShard, key: bytes) -> tuple[Path, int, int]:
    ext = shard.extent(key)
    assert ext is not None
    return ext.path, ext.payload_offset, ext.payload_length


def _read(where: tuple[Path, int, int]) -> bytes:
    path, offset, length = where
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


@pytest.mark.parametrize("fsync", [FsyncPolicy.EVERY_RECORD, FsyncPolicy.ON_CLOSE])
def test_delete_and_shred_succeed_on_a_full_file_system_and_survive_a_restart(disk, fsync):
    shard = _filled(disk, fsync=fsync)
    assert shard.stats().reserve_bytes == RESERVE
    shredded = _raw_payload(shard, b"k1")
    assert shard.delete(b"k0") is Lookup.HIT
    assert shard.shred(b"k1") is Lookup.HIT
    assert sorted(shard.keys()) == [b"k2", b"k3"]
    assert _read(shredded) == bytes(PAYLOAD)
    assert 0 < shard.stats().reserve_bytes < RESERVE  # what the tombstones took
    shard.close()
    with NvmeShard(disk.directory) as again:
        assert sorted(again.keys()) == [b"k2", b"k3"]
        assert again.get(b"k0") is Lookup.MISS and again.get(b"k1") is Lookup.MISS
        assert [again.get(b"k%d" % i) for i in (2, 3)] == [_payload(2), _payload(3)]
    assert _read(shredded) == bytes(PAYLOAD)


def test_a_put_on_a_full_file_system_fails_cleanly_and_leaves_the_reserve(disk):
    with _filled(disk) as shard:
        files = shard.stats().file_bytes
        with pytest.raises(DiskFull):
            shard.put(b"new", b"x" * 10, 1)
        assert shard.stats().file_bytes == files
        assert shard.stats().reserve_bytes == RESERVE  # a put never draws on it
        assert [shard.get(b"k%d" % i) for i in range(4)] == [_payload(i) for i in range(4)]
        assert shard.delete(b"k0") is Lookup.HIT  # the reserve is still there for this
        left = shard.stats().reserve_bytes
        with pytest.raises(DiskFull):  # and what the tombstone left over is no put's: nor
            shard.put(b"new", b"x" * PAYLOAD, 1)  # may its compaction copy 3 live records
        assert shard.stats().reserve_bytes == left  # into it (a delete would find none)
    with NvmeShard(disk.directory) as again:
        assert sorted(again.keys()) == [b"k1", b"k2", b"k3"]


def test_a_key_overwritten_on_a_full_file_system_reclaims_its_old_records(disk):
    """Overwrites leave retired records; on a full file system (no quota) a put used to
    fail for good (delete and reopen did not help) until someone called ``compact``. It
    compacts now, copying no more than the reserve and the free space can hold."""
    shard = _filled(disk, n=1, segment_bytes=8 * RECORD)
    disk.capacity += 3 * RECORD  # room for three more records, then full again
    for i in range(40):  # the live data stays one record
        shard.put(b"k0", _payload(i % 20), 1)
    assert shard.get(b"k0") == _payload(39 % 20)
    assert shard.stats().reserve_bytes == RESERVE  # drawn by the copies, given back
    shard.close()
    with NvmeShard(disk.directory) as again:
        assert again.keys() == [b"k0"] and again.get(b"k0") == _payload(39 % 20)


def test_every_tombstone_the_reserve_covers_lands_then_delete_fails_cleanly(disk):
    """The reserve holds ``reserve_tombstones`` worst-case tombstones (2 * align each);
    past what it holds, a delete raises ``DiskFull`` and the key stays, as before."""
    shard = _filled(disk, n=40, reserve_tombstones=4)
    deleted = []
    with pytest.raises(DiskFull):
        for i in range(40):
            shard.delete(b"k%d" % i)
            deleted.append(b"k%d" % i)
    assert len(deleted) >= 4 and shard.stats().reserve_bytes < 2 * BLOCK
    left = sorted(shard.keys())
    assert left == sorted(b"k%d" % i for i in range(len(deleted), 40))
    shard.close()
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=4)) as again:
        assert sorted(again.keys()) == left


def test_an_erasure_past_the_reserve_frees_the_segments_it_leaves_dead(disk):
    """With the reserve spent, a tombstone that finds no room drops the sealed segments
    no live record is left in (nothing to copy) and is written in the space they held:
    a tenant erasure on a full disk erases every key, not just as many as the reserve
    holds."""
    shard = _filled(disk, n=20, segment_bytes=RECORD, reserve_tombstones=1)
    assert shard.stats().segments == 20  # one record a segment
    shredded = [_raw_payload(shard, b"k%d" % i) for i in range(20)]
    assert all(shard.shred(b"k%d" % i) is Lookup.HIT for i in range(20))
    assert shard.keys() == [] and shard.stats().segments < 20
    assert all(_read(where) == bytes(PAYLOAD) for where in shredded if where[0].exists())
    shard.close()
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=1)) as again:
        assert again.keys() == []


def test_a_shred_whose_tombstone_finds_no_room_still_unindexes_the_zeroed_record(disk):
    """No reserve and no dead segment to free: the tombstone cannot land. The payload is
    zeroed all the same, and the key leaves the index (nothing serves or counts zeros);
    ``DiskFull`` tells the erasure the tier failed. After a restart the zeroed record is
    found again (no tombstone on disk) and a shred with room writes its tombstone."""
    shard = _filled(disk, n=2, reserve_tombstones=0)
    shredded = _raw_payload(shard, b"k0")
    with pytest.raises(DiskFull):
        shard.shred(b"k0")
    assert _read(shredded) == bytes(PAYLOAD)
    assert shard.keys() == [b"k1"] and shard.get(b"k0") is Lookup.MISS
    assert shard.shred(b"k0") is Lookup.MISS
    shard.close()
    disk.capacity += 4 * BLOCK  # an operator freed space
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=0)) as again:
        assert sorted(again.keys()) == [b"k0", b"k1"]  # the zeroed record, no tombstone
        assert again.shred(b"k0") is Lookup.HIT
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=0)) as again:
        assert again.keys() == [b"k1"] and again.get(b"k1") == _payload(1)


def test_compaction_on_a_full_file_system_frees_dead_segments_and_refills_the_reserve(disk):
    shard = _filled(disk, n=6, segment_bytes=2 * RECORD)  # two records a segment
    assert shard.stats().segments == 3
    for i in (0, 1, 2):  # the first segment dead, the second half dead
        shard.delete(b"k%d" % i)
    assert shard.stats().segments == 4  # the tombstones began a new one
    assert shard.stats().reserve_bytes < RESERVE
    report = shard.compact(min_dead_ratio=0.5)
    # the first, the second (k3 moved) and the tombstones' (no older record left)
    assert (report.segments_removed, report.records_moved) == (3, 1)
    assert shard.stats().reserve_bytes == RESERVE  # space is back: the reserve first
    assert sorted(shard.keys()) == [b"k3", b"k4", b"k5"]
    shard.close()
    with NvmeShard(disk.directory) as again:
        assert [again.get(b"k%d" % i) for i in (3, 4, 5)] == [_payload(i) for i in (3, 4, 5)]
        assert again.get(b"k0") is Lookup.MISS


def test_a_drawn_reserve_is_refilled_at_open_once_the_file_system_has_room(disk):
    with _filled(disk) as shard:
        shard.delete(b"k0")
        assert shard.stats().reserve_bytes < RESERVE
    with NvmeShard(disk.directory) as again:  # still full: nothing taken
        assert again.stats().reserve_bytes < RESERVE
    disk.capacity += RESERVE  # an operator freed space
    with NvmeShard(disk.directory) as again:
        assert again.stats().reserve_bytes == RESERVE
        assert (disk.directory / "LOCK").stat().st_size == RESERVE


def test_the_reserve_is_sized_by_the_setting_and_zero_keeps_the_old_behaviour(disk):
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=8)) as shard:
        assert shard.stats().reserve_bytes == 8 * 2 * BLOCK
        shard.put(b"k", b"v", 1)
    with NvmeShard(disk.directory, NvmeShardConfig(reserve_tombstones=0)) as shard:
        assert shard.stats().reserve_bytes == 0  # lowered: the excess is given back
        assert (disk.directory / "LOCK").stat().st_size == 0
        disk.fill()
        with pytest.raises(DiskFull):
            shard.delete(b"k")
        assert shard.keys() == [b"k"]


def test_the_reserve_is_not_counted_in_the_quota(disk):
    config = NvmeShardConfig(max_bytes=2 * RECORD + PAYLOAD + BLOCK)  # 3 aligned records
    with NvmeShard(disk.directory, config) as shard:
        for i in range(3):  # exactly what the quota holds, the reserve besides
            shard.put(b"k%d" % i, _payload(i), 1)
        assert shard.stats().file_bytes <= config.max_bytes
        assert shard.stats().reserve_bytes == RESERVE


@pytest.mark.parametrize(("value", "error"), [
    (-1, ValueError), (1 << 17, ValueError), ("8", TypeError), (True, TypeError),
    (2.0, TypeError), (None, TypeError),
])
def test_a_bad_reserve_setting_is_a_typed_error(value, error):
    with pytest.raises(error, match="reserve_tombstones must be"):
        NvmeShardConfig(reserve_tombstones=value)


@pytest.mark.parametrize(("need", "unit", "held", "drawn"), [
    (7904, 4096, 262144, 8192),  # a tombstone after an unaligned record: two blocks
    (4096, 4096, 262144, 4096),  # after an aligned one: one
    (4096, 65536, 262144, 65536),  # a file system of 64 KiB blocks: one of those
    (4096, 65536, 8192, 8192),  # less than a unit left, but enough: all of it
    (8192, 4096, 4096, 0),  # not enough: nothing
    (0, 4096, 4096, 0),
])
def test_draw_size(need, unit, held, drawn):
    assert draw_size(need, unit, held) == drawn


@pytest.mark.parametrize(("tombstones", "align", "unit", "target"), [
    (32, 4096, 4096, 262144), (0, 4096, 4096, 0), (1, 512, 4096, 4096), (3, 512, 512, 3072),
])
def test_reserve_target(tombstones, align, unit, target):
    config = NvmeShardConfig(reserve_tombstones=tombstones, align=align)
    assert reserve_target(config, unit) == target
