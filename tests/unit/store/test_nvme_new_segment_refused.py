"""A shard whose active segment is full, on a file system that refuses the next segment
file (out of inodes, space or quota), fails a put with ``SegmentNotCreated`` (a
``DiskFull`` that names the file and what ran out), changes nothing, and stays usable:
every record reads back, deletes and shreds land (in the active segment, past
``segment_bytes``), compaction compacts what it can, a reopen finds it all, and puts
succeed again once the file system has room.

Before, the refusal escaped as a bare ``OSError`` from ``os.open``, for puts and deletes
alike. These tests refuse the segment file by patching ``os.open`` (and, where it matters,
the free inodes and free space the shard reads); ``tests/integration/store/
test_nvme_full_fs.py`` runs out of inodes for real on a tmpfs.
"""

from __future__ import annotations

import errno
import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from store.nvme import (
    DiskFull,
    FsyncPolicy,
    FullResource,
    NvmeShard,
    NvmeShardConfig,
    SegmentNotCreated,
    ShardIOError,
    segments,
)
from store.nvme.files import full_resource
from store.types import Lookup

PAYLOAD = 100_000
SEGMENT = 2 * 106_496  # two records of PAYLOAD (a header block each, block-aligned)
BLOCK = 4096


def _payload(i: int) -> bytes:
    return bytes([65 + i]) * PAYLOAD


class RefusedFiles:
    """``os.open`` that refuses to create a segment file while ``err`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.err: int | None = None
        self.refused: list[str] = []
        self._open = os.open
        monkeypatch.setattr(os, "open", self.open)

    def open(self, path, flags, mode=0o777, *args, **kw):  # type: ignore[no-untyped-def]
        new = not os.path.exists(path)
        if self.err is not None and new and flags & os.O_CREAT and str(path).endswith(".akv"):
            self.refused.append(str(path))
            raise OSError(self.err, os.strerror(self.err), str(path))
        return self._open(path, flags, mode, *args, **kw)


@pytest.fixture
def refuse(monkeypatch: pytest.MonkeyPatch) -> RefusedFiles:
    return RefusedFiles(monkeypatch)


def _filled(path: Path, n: int = 4, **kw: object) -> NvmeShard:
    """k0..k{n-1}, two a segment: the last segment is full when ``n`` is even."""
    shard = NvmeShard(path, NvmeShardConfig(segment_bytes=SEGMENT, **kw))  # type: ignore[arg-type]
    for i in range(n):
        shard.put(b"k%d" % i, _payload(i), 1)
    return shard


def _contents(shard: NvmeShard) -> dict[bytes, bytes]:
    return {key: shard.get(key) for key in sorted(shard.keys())}  # type: ignore[misc]


@pytest.mark.parametrize("fsync", [FsyncPolicy.EVERY_RECORD, FsyncPolicy.NONE])
def test_a_put_refused_a_new_segment_is_disk_full_and_leaves_the_shard_usable(
        tmp_path, refuse, monkeypatch, fsync):
    monkeypatch.setattr(segments, "free_inodes", lambda _path: 0)
    shard = _filled(tmp_path, fsync=fsync)
    before, stats = _contents(shard), shard.stats()
    refuse.err = errno.ENOSPC
    with pytest.raises(SegmentNotCreated) as refused:
        shard.put(b"new", b"x" * 10, 1)
    assert isinstance(refused.value, DiskFull)
    next_file = str(tmp_path / "seg-00000002.akv")
    assert (refused.value.path, refused.value.resource) == (next_file, FullResource.INODES)
    assert "no free inode" in str(refused.value) and next_file in str(refused.value)
    assert shard.stats() == stats and _contents(shard) == before
    assert not os.path.exists(next_file)
    with pytest.raises(SegmentNotCreated):  # and again: still nothing changes
        shard.put(b"new", b"x" * 10, 1)
    assert shard.stats() == stats and _contents(shard) == before

    shredded = shard.extent(b"k1")
    assert shard.delete(b"k0") is Lookup.HIT  # the tombstones run the active segment long
    assert shard.shred(b"k1") is Lookup.HIT
    assert sorted(shard.keys()) == [b"k2", b"k3"]
    assert shard.stats().segments == 2 and max(shard._files.sizes().values()) > SEGMENT
    with open(shredded.path, "rb") as f:
        f.seek(shredded.payload_offset)
        assert f.read(shredded.payload_length) == bytes(PAYLOAD)

    refuse.err = None  # room again: the next put starts the new segment
    shard.put(b"new", b"x" * 10, 1)
    assert shard.stats().segments == 3 and os.path.exists(next_file)
    shard.close()
    with NvmeShard(tmp_path, NvmeShardConfig(segment_bytes=SEGMENT)) as again:
        assert _contents(again) == {b"k2": _payload(2), b"k3": _payload(3), b"new": b"x" * 10}


def test_a_reopen_while_new_files_are_refused_finds_everything(tmp_path, refuse):
    shard = _filled(tmp_path)
    before = _contents(shard)
    refuse.err = errno.ENOSPC
    with pytest.raises(SegmentNotCreated):
        shard.put(b"new", b"x", 1)
    shard.delete(b"k0")
    shard.close()
    tries = len(refuse.refused)
    with NvmeShard(tmp_path, NvmeShardConfig(segment_bytes=SEGMENT)) as again:
        assert _contents(again) == {k: v for k, v in before.items() if k != b"k0"}
    assert len(refuse.refused) == tries  # the reopen needed no new file


@pytest.mark.parametrize(("err", "inodes", "resource", "says"), [
    (errno.ENOSPC, 0, FullResource.INODES, "no free inode"),
    (errno.ENOSPC, 12, FullResource.SPACE, "no space left"),
    (errno.ENOSPC, None, FullResource.SPACE, "no space left"),  # no inode limit (btrfs)
    (errno.EDQUOT, 0, FullResource.QUOTA, "disk quota"),
])
def test_the_refusal_says_what_ran_out(tmp_path, refuse, monkeypatch, err, inodes, resource,
                                       says):
    monkeypatch.setattr(segments, "free_inodes", lambda _path: inodes)
    with _filled(tmp_path, n=2) as shard:
        refuse.err = err
        with pytest.raises(SegmentNotCreated, match=says) as refused:
            shard.put(b"new", b"x", 1)
        assert (refused.value.resource, refused.value.errno) == (resource, err)


@pytest.mark.parametrize(("err", "inodes", "resource"), [
    (errno.ENOSPC, 0, FullResource.INODES), (errno.ENOSPC, 1, FullResource.SPACE),
    (errno.ENOSPC, None, FullResource.SPACE), (errno.EDQUOT, 0, FullResource.QUOTA),
    (errno.EDQUOT, None, FullResource.QUOTA),
])
def test_full_resource(err, inodes, resource):
    assert full_resource(err, inodes) is resource


def test_another_refusal_of_a_new_segment_is_a_shard_io_error(tmp_path, refuse):
    with _filled(tmp_path, n=2) as shard:
        before, stats = _contents(shard), shard.stats()
        refuse.err = errno.EACCES
        with pytest.raises(ShardIOError, match="cannot create segment file"):
            shard.put(b"new", b"x", 1)
        # the full segment was synced before the new file was asked for (ON_CLOSE)
        assert shard.stats() == replace(stats, syncs=1) and _contents(shard) == before
        refuse.err = None
        shard.put(b"new", b"x", 1)
        assert shard.get(b"new") == b"x"


def test_segment_not_created_crosses_processes():
    error = SegmentNotCreated("/d/seg-00000002.akv", FullResource.INODES, errno.ENOSPC)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.path, back.resource, back.errno, str(back)) == (
        SegmentNotCreated, error.path, error.resource, error.errno, str(error))


def test_compaction_without_a_new_file_compacts_all_but_the_active_segment(tmp_path, refuse):
    shard = _filled(tmp_path, n=6)  # three full segments
    for key in (b"k0", b"k1", b"k4"):  # the first dead, the active one half dead
        shard.delete(key)
    refuse.err = errno.ENOSPC
    assert shard.stats().segments == 4  # the tombstones began a fourth
    report = shard.compact(min_dead_ratio=0.5)  # victims: the first, the third, the active
    assert (report.segments_removed, report.records_moved) == (2, 1)  # k5 moved
    assert shard.stats().segments == 2
    assert sorted(shard.keys()) == [b"k2", b"k3", b"k5"]
    assert all(shard.get(b"k%d" % i) == _payload(i) for i in (2, 3, 5))
    refuse.err = None
    shard.close()
    with NvmeShard(tmp_path, NvmeShardConfig(segment_bytes=SEGMENT)) as again:
        assert _contents(again) == {b"k%d" % i: _payload(i) for i in (2, 3, 5)}


class SimulatedDisk:
    """A file system of ``capacity`` bytes holding only the files of one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.capacity = directory, 16 << 20

    def used(self) -> int:
        return sum(-(-p.stat().st_size // BLOCK) * BLOCK
                   for p in self.directory.iterdir() if p.is_file())

    def free(self, _path: Path) -> int:
        return max(self.capacity - self.used(), 0)


def test_a_delete_without_a_new_file_on_a_full_file_system_draws_on_the_reserve(
        tmp_path, refuse, monkeypatch):
    disk = SimulatedDisk(tmp_path)
    monkeypatch.setattr(segments, "free_bytes", disk.free)
    shard = _filled(tmp_path)
    reserve = shard.stats().reserve_bytes
    disk.capacity = disk.used()  # no block left, and no file either
    refuse.err = errno.ENOSPC
    with pytest.raises(DiskFull):
        shard.put(b"new", b"x", 1)
    assert shard.delete(b"k0") is Lookup.HIT
    assert shard.shred(b"k1") is Lookup.HIT
    assert 0 < shard.stats().reserve_bytes < reserve
    assert sorted(shard.keys()) == [b"k2", b"k3"]
    shard.close()
    with NvmeShard(tmp_path, NvmeShardConfig(segment_bytes=SEGMENT)) as again:
        assert _contents(again) == {b"k2": _payload(2), b"k3": _payload(3)}
