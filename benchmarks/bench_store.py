"""Store data-plane benchmark: every figure side by side with its baseline, in one run.

  host pool   put/get vs a plain numpy copy of the same buffers (256 KiB, 2 MiB, 16 MiB)
  nvme shard  durable puts (fsync per record) vs os.write + os.fsync, and cold gets (record
              dropped from the page cache, mincore-checked) vs a cold os.preadv: the target
              is checked on these, default engine. Warm page-cache put/get vs os.write /
              os.readv (and vs os.readv + XXH3, the verification floor) for every engine,
              report only
  nixl ucx    write/read into another process vs a numpy copy (report only)
  codecs      INT8 / INT4 encode and decode GB/s of fp16 input, one thread
  directory   embedded and Redis (own redis-server on a free port) ops/s

Ratios are what matter on a noisy machine; targets are checked on them.

    .venv/bin/python benchmarks/bench_store.py [--rounds 7] [--dir /tmp] [--json OUT]
        [--only nvme ...]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from rich.console import Console
from rich.progress import Progress

from store.directory import DirectoryEntry, EmbeddedDirectory
from store.host_pool import HostPool
from store.nvme import FsyncPolicy, NvmeEngine, NvmeShard, NvmeShardConfig
from store.nvme_files import drop_range, resident_pages
from store.nvme_format import checksum
from store.transport import TransferJob, TransferOp, nixl_available
from store.types import Codec, Lookup, Tier

KIB, MIB = 1 << 10, 1 << 20
SIZES = (256 * KIB, 2 * MIB, 16 * MIB)
# NVMe: checked on durable puts and cold (device) gets; warm page-cache rows are reported.
NVME_TARGET = 0.8
console = Console(width=170)
rows: list[dict] = []
STEPS = ("host_pool", "nvme", "nixl_ucx", "codecs", "directory")


def aligned(n: int, fill: bool = False) -> np.ndarray:
    buf = np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)
    buf[:] = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8) if fill else 0
    return buf


def median_time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds per call of ``fn`` over ``reps`` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def report(
    group: str,
    case: str,
    value: str,
    ratio: float | None,
    target: float | None,
    unit: str = "ratio",
) -> None:
    """One line; ``ratio`` is the figure the target is checked on (in ``unit``)."""
    verdict = (
        "" if target is None else ("PASS" if ratio is not None and ratio >= target else "FAIL")
    )
    rows.append(
        {
            "group": group,
            "case": case,
            "value": value,
            "checked": ratio,
            "unit": unit,
            "target": target,
            "verdict": verdict,
        }
    )
    r = "" if ratio is None or unit != "ratio" else f"ratio {ratio:5.2f}"
    t = "" if target is None else f"target {unit} >= {target:g} {verdict}"
    console.print(f"{group:<10} {case:<36} {value:<46} {r:<11} {t}", highlight=False, markup=False)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bench_host_pool(rounds: int) -> None:
    for size in SIZES:
        src, dst = aligned(size, fill=True), aligned(size)
        pool = HostPool.create(f"akv-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}", size, 2)
        try:
            slot = pool.alloc()
            reps = max(5, (64 * MIB) // size)
            copy = put = get = 0.0
            copies, puts, gets = [], [], []
            for _ in range(rounds):  # interleaved so drift hits all three alike
                copies.append(median_time(lambda d=dst, s=src: np.copyto(d, s), reps))
                puts.append(median_time(lambda p=pool, k=slot, s=src: p.write(k, s), reps))
                gets.append(median_time(lambda p=pool, k=slot, d=dst: p.read(k, out=d), reps))
            copy, put, get = (statistics.median(x) for x in (copies, puts, gets))
            assert bytes(pool.read(slot, out=dst)) == src.tobytes()
        finally:
            pool.close()
            pool.unlink()
        target = 0.8 if size >= 2 * MIB else None
        label = f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"
        base = f"copy {gbps(size, copy):5.2f} GB/s"
        report(
            "host_pool",
            f"put {label}",
            f"{gbps(size, put):5.2f} GB/s vs {base}",
            copy / put,
            target,
        )
        report(
            "host_pool",
            f"get {label}",
            f"{gbps(size, get):5.2f} GB/s vs {base}",
            copy / get,
            target,
        )


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
        _, loc = shard.locate(keys[i])
        seg = os.open(root / "shard" / f"seg-{loc.segment:08d}.akv", os.O_RDONLY)
        try:
            assert resident_pages(seg, loc.payload_offset, size)[0] == 0, "record still cached"
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


def bench_ucx(rounds: int) -> None:
    if not nixl_available():
        report("nixl_ucx", "cross-process", "skipped: NIXL not installed", None, None)
        return
    from store.transport.nixl_ucx import NixlUcxTransport
    from store.transport.peer import PeerProcess

    size = 16 * MIB
    transport = NixlUcxTransport()
    peer = PeerProcess(transport, size)
    try:
        src, dst = aligned(size, fill=True), aligned(size)
        region = transport.register(src)
        back = transport.register(dst)

        def move(op: TransferOp, local) -> None:
            job = TransferJob(op=op, local=local, remote=peer.region, length=size)
            transport.wait(transport.submit(job))

        reps = 8
        copy = statistics.median(
            median_time(lambda: np.copyto(dst, src), reps) for _ in range(rounds)
        )
        write = statistics.median(
            median_time(lambda: move(TransferOp.WRITE, region), reps) for _ in range(rounds)
        )
        read = statistics.median(
            median_time(lambda: move(TransferOp.READ, back), reps) for _ in range(rounds)
        )
        assert bytes(dst) == src.tobytes() == peer.read(0, size)
        base = f"copy {gbps(size, copy):5.2f} GB/s"
        report(
            "nixl_ucx",
            "write 16 MiB to another process",
            f"{gbps(size, write):5.2f} GB/s vs {base}",
            copy / write,
            None,
        )
        report(
            "nixl_ucx",
            "read 16 MiB from another process",
            f"{gbps(size, read):5.2f} GB/s vs {base}",
            copy / read,
            None,
        )
    finally:
        peer.close()
        transport.close()


def bench_codecs(rounds: int) -> None:
    import torch

    from store.codecs import CodecSpec, decode_kv, encode_kv

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    shape = (30, 3, 512, 64)  # SmolLM2-135M: 30 layers, 3 KV heads x 64, 512 tokens
    k = torch.randn(shape, generator=gen).to(torch.float16)
    v = torch.randn(shape, generator=gen).to(torch.float16)
    nbytes = (k.numel() + v.numel()) * 2
    for codec in (Codec.INT8, Codec.INT4):
        spec = CodecSpec(codec=codec)
        enc_t = statistics.median(
            median_time(lambda s=spec: encode_kv(k, v, s), 3) for _ in range(rounds)
        )
        enc = encode_kv(k, v, spec)
        dec_t = statistics.median(median_time(lambda e=enc: decode_kv(e), 3) for _ in range(rounds))
        ratio = nbytes / enc.nbytes
        for verb, seconds in (("encode", enc_t), ("decode", dec_t)):
            rate = gbps(nbytes, seconds)
            report(
                "codec",
                f"{codec.name} {verb} (1 thread)",
                f"{rate:5.2f} GB/s of fp16, {ratio:4.2f}x smaller",
                rate,
                0.5,
                "GB/s",
            )


def _entries(ns: str, n: int, generation: int) -> list[DirectoryEntry]:
    return [
        DirectoryEntry(
            key=i.to_bytes(32, "little"),
            tenant_ns=ns,
            tier=Tier.HOST,
            node="node-0",
            location=f"pool:{i}",
            codec=Codec.INT8,
            size_bucket=4,
            generation=generation,
        )
        for i in range(n)
    ]


def _directory_rates(directory, n: int, batch: int) -> tuple[float, float, float]:
    """(puts/s, single gets/s, pipelined lookups/s) for one backend."""
    gen = directory.open_generation("bench")
    entries = _entries("bench", n, gen)
    t = time.perf_counter()
    for e in entries:
        directory.put(e)
    puts = n / (time.perf_counter() - t)
    keys = [e.key for e in entries]
    t = time.perf_counter()
    for key in keys[:2000]:
        directory.get("bench", key)
    singles = min(n, 2000) / (time.perf_counter() - t)
    t = time.perf_counter()
    hits = 0
    for i in range(0, n, batch):
        hits += sum(1 for look, _ in directory.get_many("bench", keys[i : i + batch]) if _)
    many = n / (time.perf_counter() - t)
    assert hits == n
    return puts, singles, many


def bench_directory(n: int) -> None:
    from store.directory.redis_backend import RedisDirectory
    from tests.support.redis_proc import RedisProcess

    rates = {"embedded": _directory_rates(EmbeddedDirectory(), n, 1000)}
    server = RedisProcess().start()
    try:
        redis_dir = RedisDirectory(server.url)
        rates["redis"] = _directory_rates(redis_dir, n, 1000)
        redis_dir.close()
    finally:
        server.close()
    for name, (puts, singles, many) in rates.items():
        target = 20_000 if name == "redis" else None
        report("directory", f"{name} put (atomic, one by one)", f"{puts:10,.0f} ops/s", None, None)
        report(
            "directory", f"{name} get (one round trip each)", f"{singles:10,.0f} ops/s", None, None
        )
        report(
            "directory",
            f"{name} pipelined lookups (1000/batch)",
            f"{many:10,.0f} lookups/s",
            many,
            target,
            "lookups/s",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per figure")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where NVMe files go")
    parser.add_argument("--entries", type=int, default=20_000, help="directory entries")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--only", nargs="+", choices=STEPS, help="run just these groups")
    args = parser.parse_args()
    steps = [
        ("host_pool", lambda: bench_host_pool(args.rounds)),
        ("nvme", lambda: bench_nvme(args.rounds, args.dir)),
        ("nixl_ucx", lambda: bench_ucx(args.rounds)),
        ("codecs", lambda: bench_codecs(args.rounds)),
        ("directory", lambda: bench_directory(args.entries)),
    ]
    steps = [(name, step) for name, step in steps if not args.only or name in args.only]
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("store benchmarks", total=len(steps))
        for name, step in steps:
            progress.update(task, description=name)
            step()
            progress.advance(task)
    failed = [r for r in rows if r["verdict"] == "FAIL"]
    console.print(
        f"{len(rows)} figures, {sum(r['verdict'] == 'PASS' for r in rows)} targets PASS, "
        f"{len(failed)} FAIL",
        highlight=False,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
