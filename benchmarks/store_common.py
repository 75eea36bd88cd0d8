"""What every store benchmark section shares: buffers, timing, and the report rows."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console

from store.buffers import aligned_buffer

KIB, MIB = 1 << 10, 1 << 20
SIZES = (256 * KIB, 2 * MIB, 16 * MIB)
console = Console(width=170)
rows: list[dict] = []


def aligned(n: int, fill: bool = False) -> np.ndarray:
    """A buffer as the store allocates its own (``store.buffers.aligned_buffer``: page aligned,
    pre-faulted, 2 MiB pages where the kernel allows): every row and baseline uses these."""
    buf = aligned_buffer(n)
    if fill:
        buf[:] = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    return buf


# Every row is called for at least this long before it is timed. On the 2-core VM a row
# timed right after an idle pause (the bench pauses around the other process's reads) ran
# its first 5-10 calls at about half speed, and the fixed row order always put the same
# rows there (the sealed put: 12-13 GB/s timed cold, 20-21 warm, raw AES-GCM 22-25).
WARM_S = 0.02


def median_time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds per call of ``fn`` over ``reps`` calls (after the warm-up)."""
    return statistics.median(sample_times(fn, reps))


def sample_times(fn: Callable[[], object], reps: int) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn``, after calling it for ``WARM_S`` (at
    least once): every row and baseline alike."""
    end = time.perf_counter() + WARM_S
    fn()
    while time.perf_counter() < end:
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def fast(samples: list[float]) -> float:
    """The 10th-percentile time. On the shared 2-core machine the times are bimodal (another
    process takes the core part of the time); like timeit's min (and bench_security.py), a
    low quantile measures the code rather than the neighbours. Every row and its baseline
    get the same treatment, interleaved round by round."""
    ordered = sorted(samples)
    return ordered[len(ordered) // 10]


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
