"""Sealing and opening throughput next to raw AES-256-GCM on the same buffers.

    python benchmarks/bench_security.py [--rounds 60] [--sizes-mib 2 16]

For each page size, the raw ``AESGCM.encrypt_into`` / ``decrypt_into`` and the sealers
(with ``out=`` buffers) run interleaved, round by round, on the very same preallocated,
pre-faulted buffers (raw writes its ciphertext where the sealer does), so cache placement
is identical. The figures that matter are the ratios (target: sealer >= 0.8 x raw):

  format 1     ``TenantSealer.seal`` / ``open``, one message, vs raw on one thread
  format 2, 1T ``ChunkedSealer`` (the pool's record format: sealed meta block, chunks,
               padding to a size class) on one thread, vs raw on one thread
  format 2, NT ``ChunkedSealer`` on its thread pool (one thread per core), vs raw split
               into one part per core on as many threads
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from rich.console import Console
from rich.progress import track
from rich.table import Table

from security.chunked import Binding, ChunkedSealer, default_threads, record_size
from security.keyring import FileKeySource, TenantKeyring
from security.sealing import HEADER_BYTES, TenantSealer, sealed_size

TARGET = 0.8
DIGEST = bytes(range(32))


def _buffer(n: int) -> mmap.mmap:
    buf = mmap.mmap(-1, n)  # page-aligned; written once so it is faulted in
    buf.write(b"\1" * n)
    return buf


def _fast_quantile(samples: list[float]) -> float:
    """The 10th-percentile time. On a shared 2-core box the times are bimodal (another
    process takes the core half the time); like timeit's min, a low quantile measures the
    code, not the neighbours, and is stable where the median flips between the modes."""
    ordered = sorted(samples)
    return ordered[len(ordered) // 10]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


THREADS = default_threads()
BINDING = Binding(tenant="bench", generation=1, tier=1, slot_id=bytes(32), digest=DIGEST)


def _split(n: int) -> list[tuple[int, int]]:
    step = -(-n // THREADS)
    return [(i * step, min(step, n - i * step)) for i in range(THREADS)]


def measure(n: int, rounds: int, sealer: TenantSealer) -> dict[str, float]:
    """Raw and sealer use the very same source, ciphertext and output memory.

    Each round runs raw twice and the sealer twice in a shuffled order, so both see the
    same machine states; the ratio is of the 10th-percentile times.
    """
    plain = _buffer(n)
    plain[:] = os.urandom(n)
    sealed_buf, opened = _buffer(sealed_size(n)), _buffer(n)
    body = memoryview(sealed_buf)[HEADER_BYTES:]  # where the sealer puts ciphertext and tag
    gcm, nonce, aad = AESGCM(os.urandom(32)), os.urandom(12), os.urandom(80)  # AAD as large as ours
    def raw_ct() -> None:  # the raw open needs raw ciphertext in the same place
        gcm.encrypt_into(nonce, plain, aad, body)

    def sealer_ct() -> None:
        sealer.seal("bench", DIGEST, 1, 1, 0, plain, sealed_buf)

    def nothing() -> None:
        pass

    one, many = ChunkedSealer(sealer.keyring, threads=1), ChunkedSealer(sealer.keyring)
    record = _buffer(record_size(n))
    pool = ThreadPoolExecutor(THREADS)
    parts = _split(n)
    src, rec = memoryview(plain), memoryview(record)

    def raw_mt(decrypt: bool) -> None:
        def part(i: int) -> None:
            off, k = parts[i]
            ct = rec[off + 16 * i:off + 16 * i + k + 16]
            if decrypt:
                gcm.decrypt_into(nonce, ct, aad, memoryview(opened)[off:off + k])
            else:
                gcm.encrypt_into(nonce, src[off:off + k], aad, ct)
        list(pool.map(part, range(THREADS)))

    ops = {  # op -> (prepare raw, raw, prepare sealer, sealer); preparing is not timed
        "seal": (nothing, lambda: gcm.encrypt_into(nonce, plain, aad, body),
                 nothing, lambda: sealer.seal("bench", DIGEST, 1, 1, 0, plain, sealed_buf)),
        "open": (raw_ct, lambda: gcm.decrypt_into(nonce, body, aad, opened),
                 sealer_ct, lambda: sealer.open("bench", DIGEST, 1, 1, 0, sealed_buf, opened)),
        "seal2": (nothing, lambda: gcm.encrypt_into(nonce, plain, aad, rec[:n + 16]),
                  nothing, lambda: one.seal_into(record, plain, BINDING)),
        "open2": (lambda: gcm.encrypt_into(nonce, plain, aad, rec[:n + 16]),
                  lambda: gcm.decrypt_into(nonce, rec[:n + 16], aad, opened),
                  lambda: one.seal_into(record, plain, BINDING),
                  lambda: one.open_into(record, BINDING, opened)),
        "seal2mt": (nothing, lambda: raw_mt(False),
                    nothing, lambda: many.seal_into(record, plain, BINDING)),
        "open2mt": (lambda: raw_mt(False), lambda: raw_mt(True),
                    lambda: many.seal_into(record, plain, BINDING),
                    lambda: many.open_into(record, BINDING, opened)),
    }
    times: dict[str, list[float]] = {}
    for op in ops:
        times[op], times[f"raw_{op}"] = [], []
    rng = random.Random(n)
    for _ in track(range(rounds), description=f"{n >> 20} MiB pages", transient=True):
        for op, (prep_raw, raw_fn, prep_sealer, sealer_fn) in ops.items():
            order = [True, True, False, False]  # True: raw
            rng.shuffle(order)  # sustained AES work slows the core down; no fixed position wins
            for is_raw in order:
                (prep_raw if is_raw else prep_sealer)()
                times[f"raw_{op}" if is_raw else op].append(_timed(raw_fn if is_raw else sealer_fn))
    pool.shutdown()
    assert opened[:] == plain[:], "sealer round trip failed"
    return {k: n / _fast_quantile(v) / 1e9 for k, v in times.items()}


LABELS = {"seal": "seal, format 1", "open": "open, format 1",
          "seal2": "seal, format 2, 1T", "open2": "open, format 2, 1T",
          "seal2mt": f"seal, format 2, {THREADS}T", "open2mt": f"open, format 2, {THREADS}T"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[2, 16])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as keys:
        ring = TenantKeyring(FileKeySource(keys))
        ring.create_tenant("bench")
        sealer = TenantSealer(ring)
        results = {mib: measure(mib << 20, args.rounds, sealer) for mib in args.sizes_mib}
    table = Table(title=f"AES-256-GCM sealing, p10 times over {args.rounds} shuffled rounds (GB/s)")
    for col in ("page", "op", "raw *_into", "sealer", "ratio", f"target >= {TARGET}"):
        table.add_column(col, justify="right")
    failed = 0
    for mib, r in results.items():
        for op, raw_key in ((o, f"raw_{o}") for o in ("seal", "open", "seal2", "open2",
                                                      "seal2mt", "open2mt")):
            ratio = r[op] / r[raw_key]
            ok = ratio >= TARGET
            failed += not ok
            table.add_row(f"{mib} MiB", LABELS[op], f"{r[raw_key]:.2f}", f"{r[op]:.2f}",
                          f"{ratio:.3f}",
                          "[green]PASS[/green]" if ok else "[red]FAIL[/red]")
    Console().print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
