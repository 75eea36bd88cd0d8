"""Store data-plane benchmark: every figure side by side with its baseline, in one run.

  host pool   unsealed and sealed put, get, and get from another process (256 KiB, 2 MiB,
              16 MiB) vs the baselines measured in the same run: a one-thread numpy copy, a
              multi-threaded copy (the faster of torch copy_ and a pool of numpy copies,
              threads = cores) and N-thread raw AESGCM encrypt_into / decrypt_into
              (``store_host.py``). Targets: unsealed put and cross-process get >= 0.9 of
              the multi-threaded copy (2, 16 MiB); sealed put and cross-process get >= 0.8
              of N-thread AES-GCM and >= 0.5 of unsealed (16 MiB)
  nvme shard  durable puts (fsync per record) vs os.write + os.fsync, and cold gets (record
              dropped from the page cache, mincore-checked) vs a cold os.preadv: the target
              is checked on these, default engine. Warm page-cache put/get vs os.write /
              os.readv (and vs os.readv + XXH3, the verification floor) for every engine,
              report only
  nvme sealed the library store (store.kv) on NVMe, sealed vs unsealed: durable put and
              cold get, target >= 0.7 at 16 MiB
  nixl ucx    write/read 16 MiB into another process vs a numpy copy and vs the host pool's
              cross-process get of this run, quiet and beside a one-core CPU hog
  codecs      INT8 / INT4 encode and decode GB/s of fp16 input, one thread
  directory   embedded and Redis (own redis-server on a free port) ops/s

The machine's load average is printed at the start and the end of the run.
Ratios are what matter on a noisy machine; targets are checked on them.

    .venv/bin/python benchmarks/bench_store.py [--rounds 7] [--dir /tmp] [--json OUT]
        [--png OUT] [--only nvme ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from rich.progress import Progress
from store_common import (
    MIB,
    aligned,
    console,
    fast,
    gbps,
    median_time,
    report,
    rows,
    sample_times,
)
from store_host import HostReader, bench_host_pool
from store_nvme import bench_nvme, bench_nvme_sealed

from store.directory import DirectoryEntry, EmbeddedDirectory
from store.transport import TransferJob, TransferOp, nixl_available
from store.types import Codec, Tier

STEPS = ("host_pool", "nvme", "nvme_sealed", "nixl_ucx", "codecs", "directory")


NIXL_TARGET = 0.7  # of the host pool's cross-process get, quiet and beside a one-core hog


def _hog() -> None:
    while True:
        pass


def bench_ucx(rounds: int) -> None:
    """16 MiB NIXL UCX writes and reads into another process, interleaved round by round with
    a host-pool get from another process of the same size (and a one-thread numpy copy);
    once on a quiet machine, once beside a process that spins on one core."""
    if not nixl_available():
        report("nixl_ucx", "cross-process", "skipped: NIXL not installed", None, None)
        return
    import multiprocessing as mp

    from store.transport.nixl_ucx import NixlUcxTransport
    from store.transport.peer import PeerProcess

    size = 16 * MIB
    transport = NixlUcxTransport()
    peer = PeerProcess(transport, size)
    src, dst = aligned(size, fill=True), aligned(size)
    reader = HostReader(src)
    try:
        region = transport.register(src)
        back = transport.register(dst)

        def move(op: TransferOp, local) -> None:
            job = TransferJob(op=op, local=local, remote=peer.region, length=size)
            transport.wait(transport.submit(job))

        reps = 8
        for mode in ("quiet", "1-core hog"):
            hog = None
            if mode != "quiet":
                hog = mp.get_context("spawn").Process(target=_hog, daemon=True)
                hog.start()
            try:
                t: dict[str, list[float]] = {"copy": [], "write": [], "read": [], "host": []}
                for _ in range(rounds):
                    t["copy"] += sample_times(lambda: np.copyto(dst, src), reps)
                    t["write"] += sample_times(lambda: move(TransferOp.WRITE, region), reps)
                    t["read"] += sample_times(lambda: move(TransferOp.READ, back), reps)
                    t["host"] += reader.get_seconds(reps)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.join()
            med = {k: fast(v) for k, v in t.items()}
            assert bytes(dst) == src.tobytes() == peer.read(0, size)
            host = f"host pool get {gbps(size, med['host']):5.2f} GB/s"
            for op in ("write", "read"):
                report("nixl_ucx", f"{op} 16 MiB, other process ({mode})",
                       f"{gbps(size, med[op]):5.2f} GB/s vs {host}", med["host"] / med[op],
                       NIXL_TARGET)
            report("nixl_ucx", f"  one-thread copy ({mode})",
                   f"{gbps(size, med['copy']):5.2f} GB/s", None, None)
    finally:
        reader.close()
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


def _load() -> str:
    """``uptime``'s load averages (the box is shared: every figure comes with its load)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} cores)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per figure")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where NVMe files go")
    parser.add_argument("--entries", type=int, default=20_000, help="directory entries")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--png", type=Path, help="also plot every target's ratio here")
    parser.add_argument("--only", nargs="+", choices=STEPS, help="run just these groups")
    args = parser.parse_args()
    if not Path(args.dir).is_dir():
        parser.error(f"--dir {args.dir}: not a directory")
    steps = [
        ("host_pool", lambda: bench_host_pool(args.rounds)),
        ("nvme", lambda: bench_nvme(args.rounds, args.dir)),
        ("nvme_sealed", lambda: bench_nvme_sealed(args.rounds, args.dir)),
        ("nixl_ucx", lambda: bench_ucx(args.rounds)),
        ("codecs", lambda: bench_codecs(args.rounds)),
        ("directory", lambda: bench_directory(args.entries)),
    ]
    steps = [(name, step) for name, step in steps if not args.only or name in args.only]
    console.print(f"load at start: {_load()}", highlight=False)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("store benchmarks", total=len(steps))
        for name, step in steps:
            progress.update(task, description=name)
            step()
            progress.advance(task)
    failed = [r for r in rows if r["verdict"] == "FAIL"]
    console.print(f"load at end: {_load()}", highlight=False)
    console.print(
        f"{len(rows)} figures, {sum(r['verdict'] == 'PASS' for r in rows)} targets PASS, "
        f"{len(failed)} FAIL",
        highlight=False,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.png:
        from store_plot import plot

        plot([rows], args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
