"""Sealing and opening throughput next to raw AES-256-GCM on the same buffers.

    python benchmarks/bench_security.py [--rounds 60] [--sizes-mib 2 16]

For each page size, the raw ``AESGCM.encrypt_into`` / ``decrypt_into`` and
``TenantSealer.seal`` / ``open`` (with ``out=`` buffers) run interleaved, round
by round, on the very same preallocated, pre-faulted buffers (raw writes its
ciphertext exactly where the sealer does), so cache placement is identical. The
figures that matter are the ratios (target: sealer >= 0.8 x raw).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from rich.console import Console
from rich.progress import track
from rich.table import Table

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

    ops = {  # op -> (prepare raw, raw, prepare sealer, sealer); preparing is not timed
        "seal": (nothing, lambda: gcm.encrypt_into(nonce, plain, aad, body),
                 nothing, lambda: sealer.seal("bench", DIGEST, 1, 1, 0, plain, sealed_buf)),
        "open": (raw_ct, lambda: gcm.decrypt_into(nonce, body, aad, opened),
                 sealer_ct, lambda: sealer.open("bench", DIGEST, 1, 1, 0, sealed_buf, opened)),
    }
    times: dict[str, list[float]] = {k: [] for k in ("raw_seal", "seal", "raw_open", "open")}
    rng = random.Random(n)
    for _ in track(range(rounds), description=f"{n >> 20} MiB pages", transient=True):
        for op, (prep_raw, raw_fn, prep_sealer, sealer_fn) in ops.items():
            order = [True, True, False, False]  # True: raw
            rng.shuffle(order)  # sustained AES work slows the core down; no fixed position wins
            for is_raw in order:
                (prep_raw if is_raw else prep_sealer)()
                times[f"raw_{op}" if is_raw else op].append(_timed(raw_fn if is_raw else sealer_fn))
    assert opened[:] == plain[:], "sealer round trip failed"
    return {k: n / _fast_quantile(v) / 1e9 for k, v in times.items()}


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
    for col in ("page", "op", "raw *_into", "TenantSealer", "ratio", f"target >= {TARGET}"):
        table.add_column(col, justify="right")
    failed = 0
    for mib, r in results.items():
        for op, raw_key in (("seal", "raw_seal"), ("open", "raw_open")):
            ratio = r[op] / r[raw_key]
            ok = ratio >= TARGET
            failed += not ok
            table.add_row(f"{mib} MiB", op, f"{r[raw_key]:.2f}", f"{r[op]:.2f}", f"{ratio:.3f}",
                          "[green]PASS[/green]" if ok else "[red]FAIL[/red]")
    Console().print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
