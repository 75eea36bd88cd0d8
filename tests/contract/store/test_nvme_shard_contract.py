"""NvmeShard behaves the same over both file engines: direct syscalls and NIXL POSIX."""

from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest

from store.nvme import (
    DiskFull,
    FsyncPolicy,
    InvalidRecord,
    NvmeEngine,
    NvmeShard,
    NvmeShardConfig,
    ShardClosed,
    ShardLocked,
)
from store.nvme.format import payload_digest
from store.transport import nixl_available
from store.types import Lookup

ENGINES = [
    pytest.param(NvmeEngine.SYSCALL, id="syscall"),
    pytest.param(
        NvmeEngine.NIXL_POSIX,
        id="nixl-posix",
        marks=pytest.mark.skipif(not nixl_available(), reason="no NIXL"),
    ),
]


@pytest.fixture(params=ENGINES)
def engine(request) -> NvmeEngine:
    return request.param


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def open_shard(path, engine: NvmeEngine, **config) -> NvmeShard:
    return NvmeShard(path, NvmeShardConfig(engine=engine, **config))


def test_engine_is_the_one_asked_for(tmp_path, engine):
    with open_shard(tmp_path, engine) as shard:
        assert shard.stats().engine == engine.value


def test_default_engine_is_direct_syscalls(tmp_path):
    with NvmeShard(tmp_path) as shard:
        assert shard.stats().engine == "syscall"


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, (1 << 20) + 3])
def test_put_get_round_trip(tmp_path, engine, size):
    data = blob(size, size)
    with open_shard(tmp_path, engine) as shard:
        loc = shard.put(b"key", data, generation=7)
        assert (loc.length, loc.generation, loc.payload_offset % 4096) == (size, 7, 0)
        assert shard.get(b"key") == data
        out = np.frombuffer(mmap.mmap(-1, size + 4096), np.uint8)
        view = shard.get(b"key", out=out)
        assert isinstance(view, memoryview) and bytes(view) == data
        assert out[size:].sum() == 0


def test_numpy_payloads_are_stored_as_their_bytes(tmp_path, engine):
    arr = np.arange(1000, dtype=np.float16).reshape(10, 100)
    with open_shard(tmp_path, engine) as shard:
        shard.put(b"a", arr, generation=1)
        assert shard.get(b"a") == arr.tobytes()


def test_miss_delete_and_overwrite(tmp_path, engine):
    with open_shard(tmp_path, engine) as shard:
        assert shard.get(b"nope") is Lookup.MISS
        assert shard.delete(b"nope") is Lookup.MISS
        shard.put(b"a", b"old", 1)
        shard.put(b"a", b"new", 2)
        assert shard.get(b"a") == b"new"
        assert shard.locate(b"a")[1].generation == 2
        assert shard.delete(b"a") is Lookup.HIT
        assert shard.get(b"a") is Lookup.MISS
        assert shard.locate(b"a") == (Lookup.MISS, None)
        assert len(shard) == 0


def test_restart_rebuilds_the_same_index(tmp_path, engine):
    cfg = {"segment_bytes": 1 << 20}
    data = {f"k{i}".encode(): blob(150_000 + i, i) for i in range(20)}
    with open_shard(tmp_path, engine, **cfg) as shard:
        for i, (k, v) in enumerate(data.items()):
            shard.put(k, v, generation=i % 3)
        shard.put(b"k0", b"replaced", generation=9)
        shard.delete(b"k1")
        before = {k: shard.locate(k)[1] for k in list(shard.keys())}
        assert shard.stats().segments > 1
    with open_shard(tmp_path, engine, **cfg) as shard:
        assert {k: shard.locate(k)[1] for k in list(shard.keys())} == before
        assert shard.get(b"k0") == b"replaced"
        assert shard.get(b"k1") is Lookup.MISS
        assert all(shard.get(k) == data[k] for k in data if k not in (b"k0", b"k1"))
        loc = shard.put(b"after", b"x", 1)
        assert loc.seq > max(v.seq for v in before.values())


def test_compaction_reclaims_retired_records_and_keeps_the_rest(tmp_path, engine):
    cfg = {"segment_bytes": 1 << 20}
    data = {f"k{i}".encode(): blob(200_000, i) for i in range(15)}
    with open_shard(tmp_path, engine, **cfg) as shard:
        for k, v in data.items():
            shard.put(k, v, 1)
        for k in list(data)[:10]:
            shard.delete(k)
        files_before = shard.stats().file_bytes
        report = shard.compact(min_dead_ratio=0.5)
        assert report.segments_removed >= 2 and report.records_dropped == 0
        assert shard.stats().file_bytes == files_before - report.bytes_reclaimed
        assert sorted(shard.keys()) == sorted(list(data)[10:])
    with open_shard(tmp_path, engine, **cfg) as shard:
        assert sorted(shard.keys()) == sorted(list(data)[10:])
        assert all(shard.get(k) == data[k] for k in list(data)[10:])
        assert all(shard.get(k) is Lookup.MISS for k in list(data)[:10])


def test_compaction_keeps_a_tombstone_while_an_older_record_survives(tmp_path, engine):
    cfg = {"segment_bytes": 64 << 10}
    with open_shard(tmp_path, engine, **cfg) as shard:
        shard.put(b"A", blob(40 << 10, 1), 1)  # segment 0, stays mostly live
        shard.put(b"k", blob(8 << 10, 2), 1)  # segment 0, retired below
        shard.put(b"X", blob(40 << 10, 3), 1)  # segment 1
        shard.delete(b"k")  # tombstone in segment 1
        shard.delete(b"X")  # tombstone in segment 1
        shard.put(b"Y", blob(40 << 10, 4), 1)  # segment 2
        assert shard.locate(b"A")[1].segment == 0
        report = shard.compact(min_dead_ratio=0.9)
        assert (report.segments_removed, report.records_moved) == (1, 0)
    with open_shard(tmp_path, engine, **cfg) as shard:
        assert sorted(shard.keys()) == [b"A", b"Y"]
        assert shard.get(b"k") is Lookup.MISS  # the carried tombstone still hides segment 0's copy


@pytest.mark.parametrize(
    "policy,n,expected",
    [
        (FsyncPolicy.NONE, 7, (0, 0)),
        (FsyncPolicy.EVERY_RECORD, 7, (7, 7)),
        (FsyncPolicy.EVERY_N, 7, (2, 3)),
        (FsyncPolicy.ON_CLOSE, 7, (0, 1)),
    ],
)
def test_fsync_policy_decides_when_to_sync(tmp_path, engine, policy, n, expected):
    shard = open_shard(tmp_path, engine, fsync=policy, fsync_every_n=3)
    for i in range(n):
        shard.put(bytes([i + 1]), b"x" * 100, 1)
    during = shard.stats().syncs
    shard.close()
    assert (during, shard.stats().syncs) == expected


def test_quota_full_fails_cleanly_and_publishes_nothing(tmp_path, engine):
    with open_shard(tmp_path, engine, max_bytes=1 << 20) as shard:
        shard.put(b"a", blob(600_000, 1), 1)
        before = shard.stats()
        with pytest.raises(DiskFull):
            shard.put(b"b", blob(600_000, 2), 1)
        with pytest.raises(DiskFull):
            shard.put(b"a", blob(600_000, 3), 2)  # an overwrite that does not fit keeps the old
        assert shard.stats() == before
        assert shard.get(b"b") is Lookup.MISS
        assert shard.get(b"a") == blob(600_000, 1)
        shard.put(b"c", blob(100_000, 4), 1)
        assert shard.get(b"c") == blob(100_000, 4)


def test_bad_input_is_refused_and_changes_nothing(tmp_path, engine):
    with open_shard(tmp_path, engine) as shard:
        shard.put(b"a", b"abc", 1)
        for key in (b"", b"k" * 256, "text"):
            with pytest.raises(InvalidRecord):
                shard.put(key, b"x", 1)
        with pytest.raises(InvalidRecord):
            shard.put(b"b", b"x", -1)
        with pytest.raises(InvalidRecord):
            shard.put(b"b", np.zeros((8, 8), np.uint8)[:, ::2], 1)
        with pytest.raises(InvalidRecord):
            shard.put(b"b", object(), 1)
        with pytest.raises(InvalidRecord):
            shard.get(b"a", out=bytearray(2))
        assert shard.keys() == [b"a"] and shard.get(b"a") == b"abc"


def test_one_process_per_shard_directory(tmp_path, engine):
    with open_shard(tmp_path, engine), pytest.raises(ShardLocked):
        open_shard(tmp_path, engine)
    open_shard(tmp_path, engine).close()  # released on close


def test_closed_shard_refuses_use(tmp_path, engine):
    shard = open_shard(tmp_path, engine)
    shard.close()
    with pytest.raises(ShardClosed):
        shard.put(b"a", b"x", 1)
    with pytest.raises(ShardClosed):
        shard.get(b"a")


@pytest.mark.parametrize(
    "bad",
    [
        {"align": 1000},
        {"align": 256},
        {"segment_bytes": 100},
        {"max_bytes": 0},
        {"fsync_every_n": 0},
        {"read_threads": 0},
        {"read_threads": 3},
    ],
)
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        NvmeShardConfig(**bad)


def test_a_full_shard_can_still_retire_and_compact(tmp_path, engine):
    record = 4096 + (100 << 10)
    with open_shard(tmp_path, engine, segment_bytes=record, max_bytes=2 * record) as shard:
        shard.put(b"a", blob(100 << 10, 1), 1)
        shard.put(b"b", blob(100 << 10, 2), 1)
        with pytest.raises(DiskFull):
            shard.put(b"c", blob(100 << 10, 3), 1)
        assert shard.delete(b"a") is Lookup.HIT  # the tombstone is exempt from the quota
        assert shard.compact(min_dead_ratio=1.0).segments_removed == 2
        shard.put(b"c", blob(100 << 10, 3), 1)
        assert sorted(shard.keys()) == [b"b", b"c"]


def test_oversized_record_is_refused(tmp_path, engine):
    with open_shard(tmp_path, engine, max_record_bytes=1000) as shard:
        shard.put(b"a", bytes(1000), 1)
        with pytest.raises(InvalidRecord):
            shard.put(b"b", bytes(1001), 1)
        assert shard.keys() == [b"a"]


def test_reads_into_alternating_out_buffers(tmp_path, engine):
    with open_shard(tmp_path, engine) as shard:
        shard.put(b"a", blob(5000, 1), 1)
        shard.put(b"b", blob(9000, 2), 1)
        first, second = bytearray(9000), np.zeros(9000, np.uint8)
        for _ in range(2):
            assert bytes(shard.get(b"a", out=first)) == blob(5000, 1)
            assert bytes(shard.get(b"b", out=second)) == blob(9000, 2)
            assert bytes(shard.get(b"b", out=first)) == blob(9000, 2)
        small = bytearray(6000)
        assert bytes(shard.get(b"a", out=small)) == blob(5000, 1)
        with pytest.raises(InvalidRecord):
            shard.get(b"b", out=small)
        assert shard.get(b"b") == blob(9000, 2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", [(1 << 20) + 1, 2 << 20, (5 << 20) + 3])
def test_large_records_round_trip_on_every_read_path(tmp_path, engine, size, threads):
    """One stripe-by-stripe read, and the two-thread read (4 MiB and up)."""
    data = blob(size, size)
    with open_shard(tmp_path, engine, read_threads=threads) as shard:
        shard.put(b"dead", b"x", 1)
        shard.put(b"big", data, 1)
        assert shard.get(b"big") == data
        out = np.zeros(size + 1, np.uint8)
        assert bytes(shard.get(b"big", out=out)) == data and out[size] == 0
        shard.delete(b"dead")
        compacted = shard.compact(min_dead_ratio=0.0001)  # copies "big" through a read
        assert (compacted.records_moved, compacted.records_dropped) == (1, 0)
    with open_shard(tmp_path, engine) as shard:
        assert shard.get(b"big") == data


@pytest.mark.parametrize("size", [5, (1 << 20) + 1, (5 << 20) + 3])
def test_every_write_path_stores_the_same_record(tmp_path, engine, size):
    """The read-thread setting changes reads only: both puts leave the same bytes, and the
    digest is the format's (one XXH3-64 up to a stripe, striped above)."""
    data = blob(size, 7)
    files = []
    for threads in (1, 2):
        with open_shard(tmp_path / str(threads), engine, read_threads=threads) as shard:
            loc = shard.put(b"k", data, 3)
            assert loc.checksum == payload_digest(data) and loc.length == size
        files.append((tmp_path / str(threads) / "seg-00000000.akv").read_bytes())
    assert files[0] == files[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_verify_thread_ends_with_the_shard(tmp_path, engine, threads):
    shard = open_shard(tmp_path, engine, read_threads=threads)
    shard.put(b"big", blob(4 << 20, 1), 1)
    assert shard.get(b"big") == blob(4 << 20, 1)
    helpers = [t for t in threading.enumerate() if t.name == "nvme-verify"]
    assert len(helpers) == (1 if engine is NvmeEngine.SYSCALL and threads == 2 else 0)
    shard.close()
    assert not [t for t in threading.enumerate() if t.name == "nvme-verify"]


def test_engine_must_be_an_nvme_engine():
    with pytest.raises(TypeError):
        NvmeShardConfig(engine="syscall")
