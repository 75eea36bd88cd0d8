"""``agentkv simulate``: the paper's evaluation (Tables 4-5, Figures 5-7) and trace replay."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError

TRACE_FORMATS = ("agentkv", "mooncake", "azure", "tracelab")
MAX_REPORTED_LINES = 20


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="event-level simulator of the paper's evaluation; trace replay",
        description="Compare LRU, TTL, semantic, AgentKV and ARC on the Table-3 workload "
                    "or on a replayed trace.")
    p.add_argument("--budget", type=float, default=0.35,
                   help="HBM budget as a fraction of each batch's working set (default 0.35)")
    p.add_argument("--noise", type=float, default=0.35,
                   help="prediction log-error sigma (default 0.35)")
    p.add_argument("--batches", type=int, default=3000, help="synthetic batches (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--policies", default="lru,ttl,semantic,agentkv,arc",
                   help="comma-separated policies to run (default: all five)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep", choices=("budget", "noise"),
                      help="sweep the budget (0.20-0.70) or the noise (0.05-0.90)")
    mode.add_argument("--ablation", action="store_true",
                      help="Table 5: AgentKV with each mechanism switched off")
    p.add_argument("--out-dir", type=Path, default=Path("."),
                   help="folder for the PNG plots of a sweep (default: .)")
    p.add_argument("--trace", type=Path, metavar="FILE", help="replay a trace instead")
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default="agentkv",
                   help="format of --trace (default: agentkv JSON lines)")
    p.add_argument("--strict-trace", action="store_true",
                   help="fail when any trace line is malformed (default: report and skip)")
    p.add_argument("--export-trace", type=Path, metavar="OUT",
                   help="write the (converted) trace in the AgentKV format")
    p.add_argument("--pages-per-batch", type=int, default=64,
                   help="trace replay: distinct KV blocks per batch (default 64)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agentkv_cluster.sim.config import SimConfig, SimConfigError, WorkloadConfig

    console = Console()
    if not console.is_terminal:  # pipes and CI logs: do not squeeze the tables to 80 columns
        console = Console(width=150)
    try:
        cfg = SimConfig(seed=args.seed, budget=args.budget, noise=args.noise,
                        workload=WorkloadConfig(batches=args.batches))
    except SimConfigError as exc:
        raise CliError(str(exc)) from None
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    _check_policies(policies)
    if args.pages_per_batch < 1:
        raise CliError("--pages-per-batch must be >= 1")
    if args.trace is None and (args.export_trace or args.strict_trace):
        raise CliError("--export-trace and --strict-trace need --trace")
    started = time.perf_counter()
    if args.trace is not None:
        if args.sweep or args.ablation:
            raise CliError("--trace replays one configuration; drop --sweep/--ablation")
        payload = _replay(args, cfg, policies, console)
    elif args.sweep:
        payload = _sweep(args, cfg, policies, console)
    elif args.ablation:
        payload = _ablation(cfg, console)
    else:
        payload = _compare(cfg, policies, console)
    console.print(f"[dim]finished in {time.perf_counter() - started:.1f} s[/dim]")
    if args.json:
        from agentkv_cluster.sim.report import write_json

        write_json(payload, args.json)
        console.print(f"wrote {args.json}")
    return 0


def _check_policies(policies: tuple[str, ...]) -> None:
    from agentkv_cluster.sim.policies import POLICY_NAMES

    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown or not policies:
        raise CliError(f"unknown policy {', '.join(unknown) or '(none)'}; "
                       f"known: {', '.join(POLICY_NAMES)}")


@contextmanager
def _progress(console: Any, total: int, label: str) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _print_config(cfg: Any, console: Any, source: str) -> None:
    from rich.table import Table

    wl = cfg.workload
    link = cfg.link
    shape = (f"batches={wl.batches} x {wl.blocks_per_batch} blocks  size "
             f"{wl.size_min_mb:g}-{wl.size_max_mb:g} MB (median {wl.size_median_mb:g}, "
             f"sigma {wl.size_sigma:g})" if source.startswith("synthetic")
             else f"batches={wl.batches} from the trace")
    console.print(
        f"[bold]workload[/bold] {source}  budget={cfg.budget}  noise={cfg.noise}  "
        f"seed={cfg.seed}  {shape}  link {link.bandwidth_gbps:g} GB/s + "
        f"{link.fixed_overhead_ms:g} ms + Exp({link.jitter_mean_ms:g} ms)  "
        f"compression {cfg.compression_ratio:g}:1")
    table = Table(title="per-type parameters", title_justify="left")
    for col in ("type", "mix", "reuse", "recompute ms/MB", "correctness", "idle median s",
                "idle sigma"):
        table.add_column(col, justify="right")
    for st, p in wl.types.items():
        table.add_row(st.value, f"{p.mix:.2f}", f"{p.reuse_prob:.2f}",
                      f"{p.recompute_ms_per_mb:g}", f"{p.correctness_weight:.2f}",
                      f"{p.idle_median_s:g}", f"{p.idle_sigma:g}")
    console.print(table)


def _metrics_table(title: str, policies: Any, console: Any) -> None:
    from rich.table import Table

    from agentkv_cluster.sim.report import TABLE4_COLUMNS, metric_rows

    table = Table(title=title, title_justify="left")
    table.add_column("policy")
    for _, header in TABLE4_COLUMNS:
        table.add_column(header, justify="right")
    for row in metric_rows(policies):
        table.add_row(*row)
    console.print(table)


def _compare(cfg: Any, policies: tuple[str, ...], console: Any) -> dict[str, Any]:
    from agentkv_cluster.sim.report import margins_vs_lru
    from agentkv_cluster.sim.runner import compare
    from agentkv_cluster.sim.workload import synthetic_workload

    workload = synthetic_workload(cfg)
    _print_config(cfg, console, workload.source)
    with _progress(console, len(workload) * len(policies), "simulating") as advance:
        result = compare(cfg, workload=workload, policies=policies, progress=advance)
    _metrics_table(f"restore delay and transfer at budget {cfg.budget}, noise {cfg.noise}",
                   result.policies, console)
    payload = result.to_dict()
    if "agentkv" in result.policies and "lru" in result.policies:
        margins = margins_vs_lru(result.policies)
        payload["agentkv_vs_lru"] = {k: round(v, 4) for k, v in margins.items()}
        console.print("AgentKV vs LRU: " + "  ".join(
            f"{k} {v:+.2f}" if k != "hidden_pct" else f"{k} {v:.2f}"
            for k, v in margins.items()))
    return payload


def _sweep(args: argparse.Namespace, cfg: Any, policies: tuple[str, ...],
           console: Any) -> dict[str, Any]:
    from rich.table import Table

    from agentkv_cluster.sim import plots
    from agentkv_cluster.sim.report import sweep_rows, sweep_to_dict
    from agentkv_cluster.sim.runner import BUDGET_SWEEP, NOISE_SWEEP, sweep

    values = BUDGET_SWEEP if args.sweep == "budget" else NOISE_SWEEP
    _print_config(cfg, console, f"synthetic(seed={cfg.seed})")
    total = len(values) * cfg.workload.batches * len(policies)
    with _progress(console, total, f"sweeping {args.sweep}") as advance:
        results = sweep(cfg, args.sweep, values, policies=policies, progress=advance)
    points = [(v, r.policies) for v, r in zip(values, results)]
    metrics = (("byte_hit_pct", "byte hit %"), ("p95_ms", "P95 ms"),
               ("transfer_mb_per_batch", "MB/batch"), ("risk_pct", "risk %"))
    for metric, label in metrics:
        header, rows = sweep_rows(args.sweep, points, metric)
        table = Table(title=f"{label} by {args.sweep}", title_justify="left")
        for col in header:
            table.add_column(col, justify="right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if args.sweep == "budget":
        paths = plots.budget_figures(points, args.out_dir)
    else:
        paths = plots.noise_figure(points, args.out_dir) if "agentkv" in policies else []
    for path in paths:
        console.print(f"wrote {path}")
    return sweep_to_dict(cfg.to_dict(), args.sweep, points)


def _ablation(cfg: Any, console: Any) -> dict[str, Any]:
    from rich.table import Table

    from agentkv_cluster.sim.report import PAPER_TABLE5
    from agentkv_cluster.sim.runner import ABLATIONS, ablation
    from agentkv_cluster.sim.workload import synthetic_workload

    workload = synthetic_workload(cfg)
    _print_config(cfg, console, workload.source)
    with _progress(console, len(workload) * len(ABLATIONS), "ablation") as advance:
        result = ablation(cfg, workload=workload, progress=advance)
    _metrics_table("AgentKV ablations (absolute)", result.rows, console)
    table = Table(title="Table 5: normalised to full AgentKV (paper in brackets)",
                  title_justify="left")
    for col in ("configuration", "P95", "transfer", "wrong-eviction"):
        table.add_column(col, justify="right")
    for name, norm in result.normalized().items():
        paper = PAPER_TABLE5[name]
        cells = [f"{v:.2f} [{p:.2f}]" if v is not None else f"n/a [{p:.2f}]"
                 for v, p in zip(norm.values(), paper)]
        table.add_row(name, *cells)
    console.print(table)
    return result.to_dict()


def _replay(args: argparse.Namespace, cfg: Any, policies: tuple[str, ...],
            console: Any) -> dict[str, Any]:
    from agentkv_cluster.sim.runner import compare
    from agentkv_cluster.sim.trace.convert import load_trace
    from agentkv_cluster.sim.trace.format import TraceFormatError, write_trace
    from agentkv_cluster.sim.trace.replay import ReplayConfig, reads_per_type, replay_workload

    try:
        parsed = load_trace(args.trace, args.trace_format)
    except TraceFormatError as exc:
        raise CliError(str(exc)) from None
    for err in parsed.errors[:MAX_REPORTED_LINES]:
        console.print(f"[yellow]{args.trace}: {err}[/yellow]")
    if len(parsed.errors) > MAX_REPORTED_LINES:
        console.print(f"[yellow]... and {len(parsed.errors) - MAX_REPORTED_LINES} more "
                      f"malformed lines[/yellow]")
    if parsed.errors and args.strict_trace:
        raise CliError(f"{args.trace}: {len(parsed.errors)} malformed line(s); first: "
                       f"{parsed.errors[0]}")
    if args.export_trace:
        n = write_trace(parsed.events, args.export_trace)
        console.print(f"wrote {n} events to {args.export_trace}")
    rc = ReplayConfig(pages_per_batch=args.pages_per_batch)
    try:
        workload = replay_workload(parsed.events, cfg, source=str(args.trace), rc=rc)
    except TraceFormatError as exc:
        raise CliError(str(exc)) from None
    console.print(f"[bold]trace[/bold] {args.trace} ({args.trace_format}): "
                  f"{len(parsed.events)} events from {parsed.lines} lines, "
                  f"{len(parsed.errors)} malformed; {len(workload)} batches of >= "
                  f"{rc.pages_per_batch} blocks x {rc.kv_bytes_per_token} B/token, "
                  f"reads by type {reads_per_type(workload)}")
    # The trace decides the batch count; the config printed and saved must say so.
    cfg = cfg.replace(workload=dataclasses.replace(cfg.workload, batches=len(workload)))
    _print_config(cfg, console, workload.source)
    with _progress(console, len(workload) * len(policies), "replaying") as advance:
        result = compare(cfg, workload=workload, policies=policies, progress=advance)
    _metrics_table(f"trace replay at budget {cfg.budget}, noise {cfg.noise}",
                   result.policies, console)
    payload = result.to_dict()
    payload["trace"] = {
        "file": str(args.trace), "format": args.trace_format, "events": len(parsed.events),
        "lines": parsed.lines, "pages_per_batch": rc.pages_per_batch,
        "kv_bytes_per_token": rc.kv_bytes_per_token,
        "malformed_lines": [{"line": e.line, "reason": e.reason} for e in parsed.errors],
    }
    return payload
