"""NvmeShard.drop_cache evicts exactly one record's pages, as mincore(2) sees them."""

from __future__ import annotations

import os

import numpy as np
import pytest

from store.nvme import FsyncPolicy, InvalidRecord, NvmeShard, NvmeShardConfig, ShardClosed
from store.nvme.files import drop_range, resident_pages
from store.types import Lookup

SIZE = 256 << 10


def blob(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def record_residency(shard: NvmeShard, key: bytes) -> tuple[int, int]:
    extent = shard.extent(key)
    fd = os.open(extent.path, os.O_RDONLY)
    try:
        return resident_pages(fd, extent.offset, extent.length)
    finally:
        os.close(fd)


def test_resident_pages_follows_reads_and_drops(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(blob(0))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.pread(fd, SIZE, 0)
        assert resident_pages(fd, 0, SIZE) == (64, 64)
        drop_range(fd, 0, SIZE)
        assert resident_pages(fd, 0, SIZE) == (0, 64)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: just what is read
        os.pread(fd, 8192, 4096)
        assert resident_pages(fd, 0, SIZE) == (2, 64)
        assert resident_pages(fd, 4096 + 100, 8000) == (2, 2)
        assert resident_pages(fd, 100, 0) == (0, 0)
    finally:
        os.close(fd)


def test_drop_cache_evicts_only_that_record(tmp_path):
    config = NvmeShardConfig(fsync=FsyncPolicy.EVERY_RECORD)
    with NvmeShard(tmp_path, config) as shard:
        shard.put(b"a", blob(1), 1)
        shard.put(b"b", blob(2), 1)
        pages = (SIZE + 4096) // 4096  # header block + payload
        assert record_residency(shard, b"a") == (pages, pages)
        assert shard.drop_cache(b"a") is Lookup.HIT
        assert record_residency(shard, b"a") == (0, pages)
        assert record_residency(shard, b"b") == (pages, pages)
        assert shard.get(b"a") == blob(1)  # read back from the device, still verified
        assert record_residency(shard, b"a")[0] >= SIZE // 4096


def test_drop_cache_of_unknown_key_bad_key_and_closed_shard(tmp_path):
    shard = NvmeShard(tmp_path)
    shard.put(b"a", b"x" * 10, 1)
    assert shard.drop_cache(b"nope") is Lookup.MISS
    with pytest.raises(InvalidRecord):
        shard.drop_cache(b"")
    shard.delete(b"a")
    assert shard.drop_cache(b"a") is Lookup.MISS
    shard.close()
    with pytest.raises(ShardClosed):
        shard.drop_cache(b"a")


def test_drop_cache_evicts_the_last_partial_page_too(tmp_path):
    """A payload that is not a multiple of 4 KiB ends mid-page: that page is the record's
    own (the next record starts on the next boundary) and must go as well."""
    size = (2 << 20) + 100  # header block + 513 payload pages, the last one partial
    config = NvmeShardConfig(fsync=FsyncPolicy.EVERY_RECORD)
    with NvmeShard(tmp_path, config) as shard:
        data = np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
        shard.put(b"odd", data, 1)
        shard.put(b"next", blob(4), 1)
        extent = shard.extent(b"odd")
        assert (extent.payload_length, extent.length % 4096) == (size, 100)
        pages = 1 + 513
        assert record_residency(shard, b"odd") == (pages, pages)
        assert shard.drop_cache(b"odd") is Lookup.HIT
        assert record_residency(shard, b"odd") == (0, pages)
        assert record_residency(shard, b"next")[0] == record_residency(shard, b"next")[1]
        assert shard.get(b"odd") == data


def test_extent_names_the_record_or_none(tmp_path):
    with NvmeShard(tmp_path) as shard:
        shard.put(b"a", b"x" * 10, 1)
        extent = shard.extent(b"a")
        assert extent.path.parent == tmp_path and extent.path.read_bytes()[
            extent.payload_offset:extent.payload_offset + 10] == b"x" * 10
        assert shard.extent(b"missing") is None
        with pytest.raises(InvalidRecord):
            shard.extent(b"")
