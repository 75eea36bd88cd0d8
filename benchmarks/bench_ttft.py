"""Time to first token after a tool call: restore KV from the host tier vs recompute.

A 1,024-token context (real text) is prefilled on SmolLM2-135M, stored as pages in
the shared-memory host pool (full precision and INT8) and dropped from the model's
memory, as during a tool call. When the observation returns, the first token is
produced three ways, interleaved in one run:
  full      restore full-precision pages from the host pool + prefill the observation
  int8      restore INT8 pages + prefill the observation
  recompute prefill context + observation from scratch (no KV kept)
Prints medians and the speedups; the target is >= 10x for the full restore.

    .venv/bin/python benchmarks/bench_ttft.py [--context 1024] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    DynamicCache,
    HfKVAdapter,
    drop_cache,
    prefill,
)
from agentkv_cluster.engines.model import ModelSpec, load_model
from agentkv_cluster.engines.page_store import HostPoolPageStore
from agentkv_cluster.engines.quality import context_text
from store.codecs import CodecSpec

OBSERVATION = "\n<tool_result name=\"calculator\">12 * 7 = 84</tool_result>\n"
TARGET_SPEEDUP = 10.0


def _ttft_restore(adapter, model, ctx, obs, spec) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    restored = adapter.restore("bench", ctx, spec=spec)
    t1 = time.perf_counter()
    token = int(prefill(model, obs, restored.cache)[-1].argmax())
    t2 = time.perf_counter()
    if restored.restored_tokens != len(ctx):
        raise RuntimeError(f"{spec.label}: only {restored.restored_tokens} tokens were resident")
    drop_cache(restored.cache)
    return t2 - t0, t1 - t0, token


def _ttft_recompute(model, ctx, obs) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    token = int(prefill(model, list(ctx) + list(obs), DynamicCache())[-1].argmax())
    return time.perf_counter() - t0, 0.0, token


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: AGENTKV_TORCH_THREADS or 1, see engines/model.py)")
    args = ap.parse_args(argv)
    console = Console()
    spec = ModelSpec() if args.threads is None else ModelSpec(threads=args.threads)
    args.threads = spec.threads
    loaded = load_model(spec)
    text, source = context_text()
    ids = loaded.encode(text)
    if len(ids) < args.context:
        raise SystemExit(f"{source} has only {len(ids)} tokens, need {args.context}")
    ctx, obs = ids[: args.context], loaded.encode(OBSERVATION)
    page_bytes = args.page_tokens * loaded.kv_bytes_per_token + (64 << 10)
    pages = -(-args.context // args.page_tokens)
    store = HostPoolPageStore.create(f"agentkv-bench-ttft-{os.getpid()}", page_bytes, 2 * pages)
    try:
        adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=args.page_tokens))
        cache = DynamicCache()
        prefill(loaded.model, ctx, cache)
        receipt = adapter.store("bench", ctx, cache, event_version=1,
                                specs=(CodecSpec.full(), CodecSpec.int8()))
        drop_cache(cache)  # the tool call runs: the model keeps no KV
        rows = _measure(adapter, loaded.model, ctx, obs, args.repeats)
    finally:
        store.close()
    _report(console, rows, receipt, args, source)
    full_speedup = statistics.median(rows["recompute"][0]) / statistics.median(rows["full"][0])
    return 0 if full_speedup >= TARGET_SPEEDUP else 1


def _measure(adapter, model, ctx, obs, repeats) -> dict[str, tuple[list, list, set]]:
    modes = {
        "full": lambda: _ttft_restore(adapter, model, ctx, obs, CodecSpec.full()),
        "int8": lambda: _ttft_restore(adapter, model, ctx, obs, CodecSpec.int8()),
        "recompute": lambda: _ttft_recompute(model, ctx, obs),
    }
    rows = {name: ([], [], set()) for name in modes}
    order = list(modes)
    with Progress(transient=True) as bar:
        task = bar.add_task("ttft", total=repeats * len(modes))
        for r in range(repeats + 1):  # round 0 warms allocator and kernels, not counted
            for name in order[r % 3:] + order[: r % 3]:  # rotate so no mode always goes first
                total, restore, token = modes[name]()
                if r:
                    rows[name][0].append(total)
                    rows[name][1].append(restore)
                    bar.advance(task)
                rows[name][2].add(token)
    return rows


def _report(console, rows, receipt, args, source) -> None:
    base = statistics.median(rows["recompute"][0])
    table = Table(title=f"TTFT after a tool call, {args.context}-token context "
                        f"({args.repeats} runs each, medians, {args.threads} torch threads)")
    for col in ("path", "TTFT ms", "restore ms", "speedup vs recompute", "first token"):
        table.add_column(col, justify="right")
    for name, (totals, restores, tokens) in rows.items():
        ttft = statistics.median(totals)
        table.add_row(name, f"{ttft * 1e3:.1f}", f"{statistics.median(restores) * 1e3:.1f}",
                      f"{base / ttft:.1f}x", ",".join(map(str, sorted(tokens))))
    console.print(table)
    sizes: dict[str, int] = {}
    for page in receipt.pages:
        sizes[page.spec.label] = sizes.get(page.spec.label, 0) + page.nbytes
    console.print(f"context from {source}; page={args.page_tokens} tokens; host-pool bytes: "
                  + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))
    speedup = base / statistics.median(rows["full"][0])
    verdict = "PASS" if speedup >= TARGET_SPEEDUP else "FAIL"
    console.print(f"full-restore speedup {speedup:.1f}x (target >= {TARGET_SPEEDUP:.0f}x): {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
