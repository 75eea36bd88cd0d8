"""An NVMe shard on a real, full file system (an 8 MiB tmpfs filled to the last block by
another file) still deletes and shreds: the tombstones draw on the shard's space reserve.
Before the reserve both raised ``DiskFull``, and an erasure left its key indexed. A tmpfs
out of inodes (remounted with ``nr_inodes`` at what it uses) refuses the next segment file:
a put fails with ``SegmentNotCreated`` and the shard stays usable. Needs root to mount the
tmpfs (skipped otherwise); ``tests/unit/store/test_nvme_reserve.py`` and
``test_nvme_new_segment_refused.py`` run the same paths everywhere on a simulated one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from store.nvme import (
    DiskFull,
    FsyncPolicy,
    FullResource,
    NvmeShard,
    NvmeShardConfig,
    SegmentNotCreated,
)
from store.nvme.files import free_bytes
from store.types import Lookup
from tests.support.tmpfs import fill, limit_inodes, tmpfs

pytestmark = pytest.mark.integration
PAYLOAD = 500_000
FULL_SEGMENT = 507_904  # one record of PAYLOAD (header block, aligned), no more


def _payload(i: int) -> bytes:
    return bytes([65 + i]) * PAYLOAD


def test_delete_and_shred_on_a_full_tmpfs_land_and_survive_a_reopen(tmp_path: Path) -> None:
    config = NvmeShardConfig(fsync=FsyncPolicy.EVERY_RECORD)
    with tmpfs(tmp_path / "fs", 8 << 20) as fs:
        shard = NvmeShard(fs / "shard", config)
        for i in range(4):
            shard.put(b"k%d" % i, _payload(i), 1)
        ext = shard.extent(b"k1")
        fill(fs)
        assert free_bytes(fs) == 0
        files = shard.stats().file_bytes
        with pytest.raises(DiskFull):  # a put finds no room and takes none of the reserve
            shard.put(b"new", b"x" * 10, 1)
        assert shard.stats().file_bytes == files
        assert shard.delete(b"k0") is Lookup.HIT
        assert shard.shred(b"k1") is Lookup.HIT
        assert sorted(shard.keys()) == [b"k2", b"k3"]
        shard.close()
        with NvmeShard(fs / "shard", config) as again:
            assert sorted(again.keys()) == [b"k2", b"k3"]
            assert again.get(b"k0") is Lookup.MISS and again.get(b"k1") is Lookup.MISS
            assert [again.get(b"k%d" % i) for i in (2, 3)] == [_payload(2), _payload(3)]
        with open(ext.path, "rb") as f:
            f.seek(ext.payload_offset)
            assert f.read(ext.payload_length) == bytes(PAYLOAD)


def test_a_full_tmpfs_compacts_its_dead_segment_and_gets_its_reserve_back(tmp_path) -> None:
    with tmpfs(tmp_path / "fs", 8 << 20) as fs, \
            NvmeShard(fs / "shard", NvmeShardConfig(segment_bytes=600_000)) as shard:
        for i in range(4):  # one record a segment
            shard.put(b"k%d" % i, _payload(i), 1)
        reserve = shard.stats().reserve_bytes
        fill(fs)
        shard.delete(b"k0")
        shard.delete(b"k1")
        assert shard.stats().reserve_bytes < reserve == shard.stats().reserve_target_bytes
        assert shard.compact(min_dead_ratio=1.0).segments_removed == 2  # k0's and k1's
        assert shard.stats().reserve_bytes == reserve
        assert [shard.get(b"k%d" % i) for i in (2, 3)] == [_payload(2), _payload(3)]
        shard.put(b"k4", b"x" * 100_000, 1)  # what compaction freed past the reserve


def test_an_erasure_of_every_key_on_a_full_tmpfs_outlasts_the_reserve(tmp_path) -> None:
    """One record a segment and a reserve of one tombstone: each shred leaves a segment
    dead, and the tombstones past the reserve are written where those segments were."""
    config = NvmeShardConfig(segment_bytes=600_000, reserve_tombstones=1)
    keys = [b"k%d" % i for i in range(10)]
    with tmpfs(tmp_path / "fs", 8 << 20) as fs:
        with NvmeShard(fs / "shard", config) as shard:
            for i, key in enumerate(keys):
                shard.put(key, _payload(i), 1)
            fill(fs)
            assert [shard.shred(key) for key in keys] == [Lookup.HIT] * len(keys)
            assert shard.keys() == []
        with NvmeShard(fs / "shard", config) as again:
            assert again.keys() == []


def test_a_tmpfs_out_of_inodes_refuses_a_put_typed_and_keeps_the_shard_usable(tmp_path):
    """One record a segment, and no room for a tombstone beside it: the third put needs a
    new segment file and the tmpfs has no inode left. Before, that put and the shred's
    tombstone raised a bare ``OSError``."""
    config = NvmeShardConfig(segment_bytes=FULL_SEGMENT, fsync=FsyncPolicy.EVERY_RECORD)
    with tmpfs(tmp_path / "fs", 8 << 20) as fs:
        shard = NvmeShard(fs / "shard", config)
        shard.put(b"k0", _payload(0), 1)
        shard.put(b"k1", _payload(1), 1)
        shredded = shard.extent(b"k0")
        limit_inodes(fs)
        assert os.statvfs(fs).f_favail == 0
        with pytest.raises(SegmentNotCreated, match="no free inode") as refused:
            shard.put(b"k2", _payload(2), 1)
        assert refused.value.resource is FullResource.INODES
        assert refused.value.path == str(fs / "shard" / "seg-00000002.akv")
        assert [shard.get(b"k%d" % i) for i in (0, 1)] == [_payload(0), _payload(1)]
        assert shard.shred(b"k0") is Lookup.HIT  # its tombstone goes to the active segment
        assert shard.keys() == [b"k1"]
        shard.close()
        with NvmeShard(fs / "shard", config) as again:  # a reopen needs no inode
            assert again.keys() == [b"k1"] and again.get(b"k1") == _payload(1)
            limit_inodes(fs, extra=1)  # an operator made room
            again.put(b"k2", _payload(2), 1)
        with NvmeShard(fs / "shard", config) as again:
            assert [again.get(b"k%d" % i) for i in (1, 2)] == [_payload(1), _payload(2)]
            assert again.get(b"k0") is Lookup.MISS
        with open(shredded.path, "rb") as f:
            f.seek(shredded.payload_offset)
            assert f.read(shredded.payload_length) == bytes(PAYLOAD)


def test_a_tmpfs_out_of_inodes_and_blocks_still_deletes_from_the_reserve(tmp_path):
    config = NvmeShardConfig(segment_bytes=FULL_SEGMENT)
    with tmpfs(tmp_path / "fs", 8 << 20) as fs, NvmeShard(fs / "shard", config) as shard:
        for i in range(3):
            shard.put(b"k%d" % i, _payload(i), 1)
        reserve = shard.stats().reserve_bytes
        fill(fs)
        limit_inodes(fs)
        with pytest.raises(DiskFull):
            shard.put(b"k3", b"x" * 10, 1)
        assert shard.delete(b"k0") is Lookup.HIT
        assert shard.shred(b"k1") is Lookup.HIT
        assert 0 < shard.stats().reserve_bytes < reserve
        assert shard.keys() == [b"k2"] and shard.get(b"k2") == _payload(2)


def test_one_key_overwritten_on_a_full_tmpfs_keeps_being_written(tmp_path) -> None:
    """No quota: before, the overwrites' retired records filled the file system and every
    later put failed (delete and reopen did not help). Two records a segment: the older
    segments are all dead, and go without a copy (the live record is larger than the
    reserve, so it could not be copied on a full file system)."""
    with tmpfs(tmp_path / "fs", 4 << 20) as fs, \
            NvmeShard(fs / "shard", NvmeShardConfig(segment_bytes=1 << 20)) as shard:
        for i in range(40):  # 40 x 500 kB through 4 MiB, one record live
            shard.put(b"k", _payload(i % 20), 1)
        assert shard.keys() == [b"k"] and shard.get(b"k") == _payload(39 % 20)
        assert shard.stats().reserve_bytes == shard.stats().reserve_target_bytes
