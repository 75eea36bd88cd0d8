"""An NVMe shard on a real, full file system (an 8 MiB tmpfs filled to the last block by
another file) still deletes and shreds: the tombstones draw on the shard's space reserve.
Before the reserve both raised ``DiskFull``, and an erasure left its key indexed. Needs
root to mount the tmpfs (skipped otherwise); ``tests/unit/store/test_nvme_reserve.py``
runs the same paths everywhere on a simulated file system."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.nvme import DiskFull, FsyncPolicy, NvmeShard, NvmeShardConfig
from store.nvme.files import free_bytes
from store.types import Lookup
from tests.support.tmpfs import fill, tmpfs

pytestmark = pytest.mark.integration
PAYLOAD = 500_000


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
        assert shard.stats().reserve_bytes < reserve
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
