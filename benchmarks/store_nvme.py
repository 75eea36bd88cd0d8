"""NVMe shard section of ``bench_store.py``: durable puts and cold gets (the target),
warm page-cache put/get for every engine (report), each beside raw syscalls."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from store_common import KIB, MIB, SIZES, aligned, gbps, report

from security.keyring import FileKeySource, TenantKeyring
from store.kv import KVStore, KVStoreConfig, Sealing
from store.nvme import FsyncPolicy, NvmeEngine, NvmeShard, NvmeShardConfig
from store.nvme.files import drop_range, resident_pages
from store.nvme.format import checksum
from store.transport import nixl_available
from store.types import Lookup, Tier

# Checked on durable puts and cold (device) gets; warm page-cache rows are reported.
NVME_TARGET = 0.8
SEALED_NVME_TARGET = 0.7  # sealed durable put and cold get, of the unsealed library store


def _nvme_round(
    root: Path, size: int, count: int, bufs: tuple[np.ndarray, np.ndarray], config: NvmeShardConfig
) -> tuple[float, ...]:
    """One round, record by record interleaved (page-cache writeback hits both alike), which
    side goes first alternating per record: median seconds of
    (os.write, shard put, os.readv, shard get, os.readv + xxh3 hash)."""
    src, dst = bufs
    fd = os.open(root / "raw.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    shard = NvmeShard(root / "shard", config)
    keys = [b"k%d" % i for i in range(count)]
    times: list[list[float]] = [[], [], [], [], []]

    def timed(i: int, *calls: tuple[int, Callable[[], object]]) -> None:
        for slot, fn in calls if i % 2 else calls[::-1]:
            t = time.perf_counter()
            fn()
            times[slot].append(time.perf_counter() - t)

    for i in range(count):
        timed(i, (0, lambda: os.write(fd, src)), (1, lambda i=i: shard.put(keys[i], src, 1)))
    for i in range(count):
        timed(
            i,
            (2, lambda i=i: os.preadv(fd, [dst], i * size)),
            (3, lambda i=i: shard.get(keys[i], out=dst)),
            (4, lambda i=i: (os.preadv(fd, [dst], i * size), checksum(dst))),
        )
    assert bytes(dst) == src.tobytes()
    shard.close()
    os.close(fd)
    (root / "raw.bin").unlink()
    shutil.rmtree(root / "shard")
    return tuple(statistics.median(t) for t in times)


def _nvme_device_round(
    root: Path, size: int, count: int, bufs: tuple[np.ndarray, np.ndarray], config: NvmeShardConfig
) -> tuple[float, ...]:
    """One durable-write + cold-read round, interleaved like ``_nvme_round``: median seconds of
    (os.write + os.fsync, shard put with an fsync per record, cold os.preadv, cold shard get).

    Before each timed read that record's range is dropped from the page cache on its side
    (``posix_fadvise(DONTNEED)`` on the raw file, ``NvmeShard.drop_cache`` on the shard), and
    mincore(2) confirms both are out of cache, so both reads come from the device.
    """
    src, dst = bufs
    fd = os.open(root / "raw.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    shard = NvmeShard(root / "shard", replace(config, fsync=FsyncPolicy.EVERY_RECORD))
    keys = [b"k%d" % i for i in range(count)]
    times: list[list[float]] = [[], [], [], []]

    def timed(i: int, *calls: tuple[int, Callable[[], object], Callable[[], None]]) -> None:
        for slot, fn, prepare in calls if i % 2 else calls[::-1]:
            prepare()
            t = time.perf_counter()
            fn()
            times[slot].append(time.perf_counter() - t)

    def nothing() -> None:
        pass

    def drop_raw(i: int) -> None:
        drop_range(fd, i * size, size)
        assert resident_pages(fd, i * size, size)[0] == 0, "raw range still cached"

    def drop_shard(i: int) -> None:
        assert shard.drop_cache(keys[i]) is Lookup.HIT
        extent = shard.extent(keys[i])
        seg = os.open(extent.path, os.O_RDONLY)
        try:
            assert resident_pages(seg, extent.offset, extent.length)[0] == 0, "record still cached"
        finally:
            os.close(seg)

    for i in range(count):
        timed(
            i,
            (0, lambda: (os.write(fd, src), os.fsync(fd)), nothing),
            (1, lambda i=i: shard.put(keys[i], src, 1), nothing),
        )
    for i in range(count):
        timed(
            i,
            (2, lambda i=i: os.preadv(fd, [dst], i * size), lambda i=i: drop_raw(i)),
            (3, lambda i=i: shard.get(keys[i], out=dst), lambda i=i: drop_shard(i)),
        )
    assert bytes(dst) == src.tobytes()
    assert shard.stats().syncs >= count
    shard.close()
    os.close(fd)
    (root / "raw.bin").unlink()
    shutil.rmtree(root / "shard")
    return tuple(statistics.median(t) for t in times)


def _nvme_variants() -> list[tuple[str, NvmeShardConfig, int]]:
    """(label, config, smallest size reported); the default engine comes first."""
    base = NvmeShardConfig(fsync=FsyncPolicy.NONE)
    variants = [
        ("syscall", base, 0),
        ("syscall, 1 read thread", replace(base, read_threads=1), 2 * MIB),
    ]
    if nixl_available():
        variants.append(("nixl-posix", replace(base, engine=NvmeEngine.NIXL_POSIX), 0))
    return variants


def _nvme_row(case: str, size: int, shard_s: float, raw_s: float, raw: str, target) -> None:
    value = f"{gbps(size, shard_s):5.2f} GB/s vs {raw} {gbps(size, raw_s):5.2f} GB/s"
    report("nvme", case, value, raw_s / shard_s, target)


def bench_nvme_device(rounds: int, root: Path, size: int, label: str) -> None:
    """Durable puts and cold (device) gets of the default engine: the rows the target is on.
    One read thread is reported beside it (gets of 2 MiB and up; its puts are the same)."""
    bufs = aligned(size, fill=True), aligned(size)
    count = max(8, (16 * MIB) // size)
    for name, config, smallest in _nvme_variants()[:2]:
        if size < smallest:
            continue
        runs = [_nvme_device_round(root, size, count, bufs, config) for _ in range(rounds)]
        raw_w, put, raw_r, get = (statistics.median(col) for col in zip(*runs))
        target = NVME_TARGET if config.read_threads == 2 else None
        if config.read_threads == 2:
            _nvme_row(f"put {label} durable [{name}]", size, put, raw_w, "write+fsync", target)
        _nvme_row(f"get {label} cold [{name}]", size, get, raw_r, "cold preadv", target)


def bench_nvme_warm(rounds: int, root: Path, size: int, label: str) -> None:
    """Page-cache puts and gets of every engine (report only; see BENCHMARKS.md)."""
    bufs = aligned(size, fill=True), aligned(size)
    count = max(8, (32 * MIB) // size)
    for name, config, smallest in _nvme_variants():
        if size < smallest:
            continue
        runs = [_nvme_round(root, size, count, bufs, config) for _ in range(rounds)]
        raw_w, put, raw_r, get, floor = (statistics.median(col) for col in zip(*runs))
        if config.read_threads == 2:  # puts do not depend on read_threads
            _nvme_row(f"put {label} warm [{name}]", size, put, raw_w, "os.write", None)
        _nvme_row(f"get {label} warm [{name}]", size, get, raw_r, "os.readv", None)
        _nvme_row("  (warm get vs os.readv + xxh3)", size, get, floor, "readv+xxh3", None)


def bench_nvme(rounds: int, base_dir: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="akv-bench-nvme-", dir=base_dir))
    try:
        for size in SIZES:
            label = f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"
            bench_nvme_device(rounds, root, size, label)
            bench_nvme_warm(rounds, root, size, label)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sealed_round(root: Path, size: int, count: int, bufs: tuple[np.ndarray, np.ndarray],
                  ring: TenantKeyring) -> tuple[float, ...]:
    """Durable puts and cold gets through the library store, unsealed and sealed, record by
    record interleaved: median seconds of (put, sealed put, cold get, cold sealed get)."""
    src, dst = bufs
    config = NvmeShardConfig(fsync=FsyncPolicy.EVERY_RECORD)
    stores = [KVStore(KVStoreConfig(name=f"unused-{i}", slot_bytes=size, nvme_dir=str(root / d),
                                    nvme=config), sealing)
              for i, (d, sealing) in enumerate((("plain", None),
                                                ("sealed", Sealing(keyring=ring, tenant="bench"))))]
    keys = [b"k%d" % i for i in range(count)]
    times: list[list[float]] = [[], [], [], []]
    try:
        for i in range(count):
            for s in (0, 1) if i % 2 else (1, 0):
                t = time.perf_counter()
                stores[s].put(keys[i], src, Tier.NVME)
                times[s].append(time.perf_counter() - t)
        for i in range(count):
            for s in (0, 1) if i % 2 else (1, 0):
                stores[s].nvme.sync()
                assert stores[s].drop_cache(keys[i])
                t = time.perf_counter()
                stores[s].get(keys[i], out=dst)
                times[2 + s].append(time.perf_counter() - t)
                assert checksum(dst) == checksum(src)
    finally:
        for store in stores:
            store.close()
        shutil.rmtree(root / "plain", ignore_errors=True)
        shutil.rmtree(root / "sealed", ignore_errors=True)
    return tuple(statistics.median(t) for t in times)


def bench_nvme_sealed(rounds: int, base_dir: str) -> None:
    """Sealed vs unsealed durable puts and cold gets (library store, default engine)."""
    root = Path(tempfile.mkdtemp(prefix="akv-bench-nvme-sealed-", dir=base_dir))
    keys = root / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("bench")
    try:
        for size in (2 * MIB, 16 * MIB):
            bufs = aligned(size, fill=True), aligned(size)
            count = max(6, (32 * MIB) // size)
            runs = [_sealed_round(root, size, count, bufs, ring) for _ in range(rounds)]
            put, sput, get, sget = (statistics.median(col) for col in zip(*runs))
            label = f"{size // MIB} MiB"
            target = SEALED_NVME_TARGET if size >= 16 * MIB else None
            report("nvme", f"sealed put {label} durable", f"{gbps(size, sput):5.2f} GB/s vs "
                   f"unsealed {gbps(size, put):5.2f} GB/s", put / sput, target)
            report("nvme", f"sealed get {label} cold", f"{gbps(size, sget):5.2f} GB/s vs "
                   f"unsealed {gbps(size, get):5.2f} GB/s", get / sget, target)
    finally:
        shutil.rmtree(root, ignore_errors=True)
