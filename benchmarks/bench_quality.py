"""Quality of compressed KV restores on SmolLM2-135M; writes the table in docs/quality.md.

Each window: 512 context tokens of real text are prefilled, stored as 64-token pages
in the shared-memory host pool in every codec, restored, and the next 256 tokens are
teacher-forced on top; each codec is compared with the uninterrupted full-precision
run (top-1 agreement, mean KL, perplexity change). Up to four disjoint windows are
pooled.

    .venv/bin/python benchmarks/bench_quality.py [--windows 4] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agentkv_cluster.engines.hf import AdapterConfig, HfKVAdapter
from agentkv_cluster.engines.model import load_model
from agentkv_cluster.engines.page_store import HostPoolPageStore
from agentkv_cluster.engines.quality import QualityRow, context_text, measure_windows
from store.codecs import CodecSpec

SPECS = (
    CodecSpec.full(), CodecSpec.int8(), CodecSpec(codec=CodecSpec.int8().codec, key_grouping="channel"),
    CodecSpec.int4(), CodecSpec.int4("token"), CodecSpec.int2(), CodecSpec.int2("token"),
    CodecSpec.low_rank(16),
)
# Acceptance lines of issue 7: label -> (min top-1, max KL, max |PPL change|).
BOUNDS = {"full": (1.0, 0.0, 0.0), "int8": (0.99, 1e-3, 0.005), "int4-kivi": (0.93, 0.02, 0.03)}


def _verdict(row: QualityRow, rows: dict[str, QualityRow]) -> str:
    if row.label == "int2-kivi":
        return "lossy (reported)" if not row.lossless else "UNEXPECTEDLY LOSSLESS"
    if row.label not in BOUNDS:
        return ""
    top1, kl, ppl = BOUNDS[row.label]
    ok = row.top1 >= top1 and row.kl <= kl and abs(row.ppl_change) <= ppl
    if row.label == "full":
        ok = ok and row.lossless
    if row.label == "int4-kivi":
        ok = ok and row.kl < rows["int4-tok"].kl
    return "pass" if ok else "FAIL"


def _markdown(rows: list[QualityRow], source: str, windows: int, seconds: float) -> str:
    by_label = {r.label: r for r in rows}
    lines = [
        "# KV restore quality on a real model",
        "",
        "Produced by `.venv/bin/python benchmarks/bench_quality.py` (do not edit the table by",
        "hand; rerun the command). Model: SmolLM2-135M-Instruct (GGUF Q4_1 weights,",
        f"de-quantised to fp32; KV is fp32). Text: `{Path(source).name}`, {windows} disjoint",
        "windows of 512 context + 256 teacher-forced continuation tokens.",
        "Context KV is stored as 64-token pages in the shared-memory host pool, restored, and",
        "compared with the uninterrupted full-precision run at every continuation position.",
        f"Run time {seconds:.0f} s.",
        "",
        ("| codec | bytes vs full | top-1 agreement | worst window | mean KL (nats) "
         "| PPL change | max abs logit diff | acceptance |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.bytes_ratio:.3f} | {r.top1:.4f} | {r.top1_min:.4f} | {r.kl:.2e} "
            f"| {r.ppl_change * 100:+.2f}% | {r.max_abs_logit:.3g} | {_verdict(r, by_label)} |")
    lines += [
        "",
        f"Reference perplexity (full precision) over these tokens: {rows[0].ppl_ref:.2f}.",
        "",
        "Acceptance (issue 7): INT8 top-1 >= 0.99, KL <= 1e-3, |PPL change| <= 0.5%;",
        "INT4 KIVI (keys per channel, values per token, group 32) top-1 >= 0.93, KL <= 0.02,",
        "|PPL change| <= 3% and strictly lower KL than INT4 with per-token keys; INT2 lossy.",
        "",
        "Reading the table:",
        "- One window has 256 positions, so one flipped near-tie moves a window's top-1 by",
        "  0.0039; the pooled figure is the acceptance figure, the worst window is shown too",
        (f"  (INT8's worst single window: {by_label['int8'].top1_min:.4f}; a single window "
         "can fall below 0.99 while"),
        "  KL stays ~1e-5: the flips are near-ties of the full-precision run).",
        "- `bytes vs full` is the exact stored page size (codes, scales, minimums, KIVI's",
        "  full-precision residual of the last partial key group, wire header) over fp32 pages.",
        "- INT2 and low-rank are never used as a sole copy: they may only serve as drafts",
        "  verified against a full reference copy (`agentkv_cluster/engines/verify.py`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--no-write", action="store_true", help="print only; keep docs/quality.md")
    args = ap.parse_args(argv)
    console = Console()
    t0 = time.perf_counter()
    loaded = load_model()
    text, source = context_text()
    ids = loaded.encode(text)
    slot = 64 * loaded.kv_bytes_per_token + (64 << 10)
    store = HostPoolPageStore.create(f"agentkv-bench-quality-{os.getpid()}", slot, 8 * len(SPECS))
    try:
        adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=64))
        windows = min(args.windows, len(ids) // 768)
        with Progress(transient=True) as bar:
            task = bar.add_task("quality windows", total=windows)
            rows = measure_windows(adapter, loaded.model, ids, SPECS, max_windows=windows,
                                   progress=lambda: bar.advance(task))
    finally:
        store.close()
    doc = _markdown(rows, source, windows, time.perf_counter() - t0)
    by_label = {r.label: r for r in rows}
    table = Table(title=f"KV restore quality, {windows} x (512 ctx + 256 teacher-forced)")
    for col in ("codec", "bytes", "top-1", "worst", "KL", "dPPL", "verdict"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.label, f"{r.bytes_ratio:.3f}", f"{r.top1:.4f}", f"{r.top1_min:.4f}",
                      f"{r.kl:.2e}", f"{r.ppl_change * 100:+.2f}%", _verdict(r, by_label))
    console.print(table)
    if not args.no_write:
        (REPO / "docs" / "quality.md").write_text(doc)
        console.print("wrote docs/quality.md")
    failed = [r.label for r in rows if _verdict(r, by_label) == "FAIL"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
