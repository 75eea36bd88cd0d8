"""NVMe shard fault injection on real files: bit flips, truncation, killed writers, full disks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from store.nvme import DiskFull, NvmeEngine, NvmeShard, NvmeShardConfig
from store.nvme import format as fmt
from store.transport import nixl_available
from store.types import Lookup

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
ENGINES = [
    pytest.param(NvmeEngine.SYSCALL, id="syscall"),
    pytest.param(
        NvmeEngine.NIXL_POSIX,
        id="nixl-posix",
        marks=pytest.mark.skipif(not nixl_available(), reason="no NIXL"),
    ),
]


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def seg_path(root: Path, segment: int) -> Path:
    return root / f"seg-{segment:08d}.akv"


def flip_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


@pytest.fixture
def filled(tmp_path):
    """A shard directory holding k0..k4 (100 kB each), closed."""
    data = {f"k{i}".encode(): blob(100_000, i) for i in range(5)}
    with NvmeShard(tmp_path) as shard:
        for k, v in data.items():
            shard.put(k, v, 1)
        locs = {k: shard.locate(k)[1] for k in data}
    return tmp_path, data, locs


@pytest.mark.parametrize("engine", ENGINES)
def test_bit_flipped_payload_is_a_miss(filled, engine):
    root, data, locs = filled
    flip_bit(seg_path(root, 0), locs[b"k2"].payload_offset + 5_000)
    with NvmeShard(root, NvmeShardConfig(engine=engine)) as shard:
        assert shard.get(b"k2") is Lookup.MISS
        assert shard.stats().corrupt_records == 1
        assert shard.get(b"k2") is Lookup.MISS  # dropped from the index, stays a miss
        assert all(shard.get(k) == v for k, v in data.items() if k != b"k2")


def test_bit_flipped_header_hides_only_that_record(filled):
    root, data, locs = filled
    flip_bit(seg_path(root, 0), locs[b"k1"].offset + 30)  # inside the header fields
    with NvmeShard(root) as shard:
        assert sorted(shard.keys()) == [b"k0", b"k2", b"k3", b"k4"]
        assert all(shard.get(k) == data[k] for k in sorted(shard.keys()))


@pytest.mark.parametrize("cut", ["in-header", "in-padding", "in-payload", "one-byte-short"])
def test_truncated_tail_record_is_dropped_and_the_rest_rebuilt(filled, cut):
    root, data, locs = filled
    last = locs[b"k4"]
    at = {
        "in-header": last.offset + 20,
        "in-padding": last.offset + 2_000,
        "in-payload": last.payload_offset + 50_000,
        "one-byte-short": last.payload_offset + last.length - 1,
    }[cut]
    os.truncate(seg_path(root, 0), at)
    with NvmeShard(root) as shard:
        assert sorted(shard.keys()) == [b"k0", b"k1", b"k2", b"k3"]
        assert all(shard.get(k) == data[k] for k in sorted(shard.keys()))
        end_k3 = locs[b"k3"].payload_offset + locs[b"k3"].length
        assert seg_path(root, 0).stat().st_size == end_k3  # torn tail cut away
        shard.put(b"k5", b"fresh", 2)
    with NvmeShard(root) as shard:
        assert sorted(shard.keys()) == [b"k0", b"k1", b"k2", b"k3", b"k5"]
        assert shard.get(b"k5") == b"fresh"


def test_record_whose_file_was_cut_under_a_live_shard_is_a_miss(filled):
    root, data, locs = filled
    with NvmeShard(root) as shard:
        os.truncate(seg_path(root, 0), locs[b"k4"].payload_offset + 10)
        assert shard.get(b"k4") is Lookup.MISS
        assert shard.get(b"k3") == data[b"k3"]


def test_torn_value_carrying_a_record_image_never_resurrects_it(tmp_path):
    # A put killed half-way whose value holds, on a 4 KiB boundary, the image of a whole
    # record (header and checksums) for another key: recovery must cut the torn value away
    # and never adopt the image inside it, whatever its sequence number.
    forged = b"FORGED BYTES"
    block = fmt.header_block(len(b"victim"), 4096)
    image = bytearray(block + len(forged))
    fmt.pack_fields_into(memoryview(image), 0, b"victim", 0, len(forged), 1 << 40,
                         fmt.checksum(forged))
    image[block:] = forged
    value = bytearray(512 << 10)
    for at in range(4096, len(value) - len(image), 64 << 10):
        value[at : at + len(image)] = image
    with NvmeShard(tmp_path) as shard:
        shard.put(b"victim", b"the real value", 1)
        good_end = shard.locate(b"victim")[1].payload_offset + len(b"the real value")
        shard.put(b"big", bytes(value), 1)
        big = shard.locate(b"big")[1]
    os.truncate(seg_path(tmp_path, 0), big.payload_offset + big.length - (256 << 10))
    with NvmeShard(tmp_path) as shard:
        assert shard.keys() == [b"victim"]
        assert shard.get(b"victim") == b"the real value"
        assert seg_path(tmp_path, 0).stat().st_size == good_end  # the torn value cut away


WRITER = textwrap.dedent("""
    import sys
    from store.nvme import NvmeShard, NvmeShardConfig
    shard = NvmeShard(sys.argv[1], NvmeShardConfig(segment_bytes=64 << 20))
    for i in range(100_000):
        shard.put(b"k%d" % i, bytes([i % 251]) * (4 << 20), 1)
        print("stored", i, flush=True)
""")


@pytest.mark.parametrize("extra_records", [0, 2, 5])
def test_writer_killed_mid_append_leaves_no_torn_record(tmp_path, extra_records):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    stored = 0
    while stored < 3 + extra_records:
        line = proc.stdout.readline()
        assert line != "", "writer died early"
        stored += line.startswith("stored ")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    with NvmeShard(tmp_path) as shard:
        keys = shard.keys()
        assert len(keys) >= 3 + extra_records
        for key in keys:
            i = int(key[1:])
            assert shard.get(key) == bytes([i % 251]) * (4 << 20)
        indices = sorted(int(k[1:]) for k in keys)
        assert indices == list(range(len(indices)))  # a prefix: nothing lost before the kill
        ends = [shard.locate(k)[1] for k in keys]
        last = max(ends, key=lambda loc: loc.seq)
        assert seg_path(tmp_path, last.segment).stat().st_size == last.payload_offset + last.length


def test_full_tmpfs_fails_cleanly(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True,
            check=False,
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        stored = {}
        with NvmeShard(mnt / "shard") as shard:
            with pytest.raises(DiskFull):
                for i in range(20):
                    shard.put(b"k%d" % i, blob(200_000, i), 1)
                    stored[b"k%d" % i] = blob(200_000, i)
            size = seg_path(mnt / "shard", 0).stat().st_size
            assert len(stored) >= 3 and sorted(shard.keys()) == sorted(stored)
            assert all(shard.get(k) == v for k, v in stored.items())
        assert seg_path(mnt / "shard", 0).stat().st_size == size
        with NvmeShard(mnt / "shard") as shard:
            assert sorted(shard.keys()) == sorted(stored)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: never leave it behind


FSIZE_WRITER = textwrap.dedent("""
    import json, resource, signal, sys
    from store.nvme import NvmeEngine, NvmeShard, NvmeShardConfig
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = (1 << 20) + (100 << 10)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    shard = NvmeShard(sys.argv[1], NvmeShardConfig(engine=NvmeEngine(sys.argv[2])))
    shard.put(b"a", b"A" * (512 << 10), 1)
    size_before = shard.stats().file_bytes
    try:
        shard.put(b"b", b"B" * int(sys.argv[3]), 1)
        error = None
    except Exception as exc:
        error = type(exc).__name__
    print(json.dumps({"error": error, "keys": sorted(k.decode() for k in shard.keys()),
                      "size_before": size_before, "size_after": shard.stats().file_bytes,
                      "a_ok": shard.get(b"a") == b"A" * (512 << 10)}))
    shard.close()
""")


@pytest.mark.parametrize("engine", ENGINES)
# 768 KiB: one stripe; 5 MiB: a striped digest, and the write cut several stripes in
@pytest.mark.parametrize("size", [768 << 10, 5 << 20])
def test_write_refused_by_the_os_rolls_back(tmp_path, engine, size):
    """The file system refuses mid-record (RLIMIT_FSIZE): the partial record is cut away."""
    out = subprocess.run(
        [sys.executable, "-c", FSIZE_WRITER, str(tmp_path), engine.value, str(size)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    syscall = engine is NvmeEngine.SYSCALL
    expected_errors = {"DiskFull"} if syscall else {"DiskFull", "ShardIOError"}
    assert report["error"] in expected_errors
    assert report["keys"] == ["a"] and report["a_ok"]
    assert report["size_after"] == report["size_before"]
    assert os.path.getsize(seg_path(tmp_path, 0)) == report["size_before"]


STRIPE = 1 << 20
# Two read paths for large records: one thread, stripe by stripe (below 4 MiB), and two
# threads sharing the stripes (4 MiB and up).
LARGE = {"one-thread": STRIPE + STRIPE // 2 + 7, "two-threads": 5 * STRIPE + 3}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", sorted(LARGE))
@pytest.mark.parametrize("where", ["first-stripe", "second-stripe", "last-partial-stripe"])
def test_a_flip_in_any_stripe_of_a_large_record_is_a_miss(tmp_path, engine, path, where):
    size = LARGE[path]
    at = {"first-stripe": 10, "second-stripe": STRIPE + 5, "last-partial-stripe": size - 1}[where]
    with NvmeShard(tmp_path) as shard:
        shard.put(b"big", blob(size, 1), 1)
        shard.put(b"next", blob(size, 2), 1)
        loc = shard.locate(b"big")[1]
    flip_bit(seg_path(tmp_path, 0), loc.payload_offset + at)
    out = np.zeros(size, np.uint8)
    with NvmeShard(tmp_path, NvmeShardConfig(engine=engine)) as shard:
        assert shard.get(b"big", out=out) is Lookup.MISS
        assert shard.get(b"big") is Lookup.MISS
        assert shard.stats().corrupt_records == 1
        assert bytes(shard.get(b"next", out=out)) == blob(size, 2)
        assert shard.get(b"next") == blob(size, 2)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", sorted(LARGE))
def test_a_large_record_cut_short_under_a_live_shard_is_a_miss(tmp_path, engine, path):
    size = LARGE[path]
    with NvmeShard(tmp_path, NvmeShardConfig(engine=engine)) as shard:
        shard.put(b"first", blob(size, 1), 1)
        shard.put(b"last", blob(size, 2), 1)
        loc = shard.locate(b"last")[1]
        os.truncate(seg_path(tmp_path, 0), loc.payload_offset + size - 2)
        assert shard.get(b"last", out=np.zeros(size, np.uint8)) is Lookup.MISS
        assert shard.get(b"first") == blob(size, 1)


def _rewrite_as_version_1(root: Path, key: bytes, payload: bytes, loc) -> None:
    """Turn a record into what format version 1 wrote: one XXH3-64 over the whole payload."""
    header = fmt.RecordHeader(
        flags=0,
        key=key,
        generation=loc.generation,
        payload_len=loc.length,
        seq=loc.seq,
        payload_hash=fmt.checksum(payload),
        version=1,
    )
    block = bytearray(loc.payload_offset - loc.offset)
    fmt.pack_header_into(memoryview(block), header)
    with open(seg_path(root, loc.segment), "r+b") as f:
        f.seek(loc.offset)
        f.write(block)


@pytest.mark.parametrize("engine", ENGINES)
def test_version_1_records_are_still_read_and_verified(tmp_path, engine):
    data = {b"small": blob(5000, 1), b"large": blob(3 * STRIPE + 11, 2)}
    with NvmeShard(tmp_path) as shard:
        locs = {k: shard.put(k, v, 4) for k, v in data.items()}
    for k, v in data.items():
        _rewrite_as_version_1(tmp_path, k, v, locs[k])
    with NvmeShard(tmp_path, NvmeShardConfig(engine=engine)) as shard:
        assert {k: shard.locate(k)[1].version for k in data} == {b"small": 1, b"large": 1}
        assert all(shard.get(k) == v for k, v in data.items())
        assert bytes(shard.get(b"large", out=bytearray(len(data[b"large"])))) == data[b"large"]
        shard.put(b"new", b"x" * 10, 1)
        assert shard.locate(b"new")[1].version == fmt.FORMAT_VERSION
    flip_bit(seg_path(tmp_path, 0), locs[b"large"].payload_offset + 2 * STRIPE + 1)
    with NvmeShard(tmp_path, NvmeShardConfig(engine=engine)) as shard:
        assert shard.get(b"large") is Lookup.MISS
        assert shard.get(b"small") == data[b"small"]


def test_a_damaged_newest_record_never_lets_an_older_one_come_back(tmp_path):
    """A damaged record was dropped from the index without a tombstone: once compaction
    removed its segment, the next recovery published the key's older record again (its
    segment kept for the live records beside it), so a key deleted or replaced came back
    with a stale value (found by review)."""
    cfg = NvmeShardConfig(segment_bytes=64 << 10)
    with NvmeShard(tmp_path, cfg) as shard:
        shard.put(b"k", blob(10_000, 1), 1)  # segment 0, beside a live record
        shard.put(b"keep", blob(40_000, 3), 1)
        shard.put(b"k", blob(20_000, 2), 2)  # does not fit segment 0: segment 1
        loc = shard.locate(b"k")[1]
        assert loc.segment == 1 and shard.locate(b"keep")[1].segment == 0
        flip_bit(seg_path(tmp_path, 1), loc.payload_offset + 5_000)
        assert shard.get(b"k") is Lookup.MISS  # damaged: dropped
        assert shard.delete(b"k") is Lookup.MISS  # the user's delete finds nothing to do
        report = shard.compact(min_dead_ratio=0.5)  # segment 1 goes, segment 0 stays
        assert seg_path(tmp_path, 0).exists() and not seg_path(tmp_path, 1).exists(), report
    with NvmeShard(tmp_path, cfg) as shard:
        assert shard.get(b"k") is Lookup.MISS  # not the old value back
        assert shard.get(b"keep") == blob(40_000, 3)
