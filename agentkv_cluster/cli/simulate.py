"""``agentkv simulate``: the paper's evaluation (Tables 4-5, Figures 5-7) and trace replay."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError, ProgressLines, check_writable_dir, check_writable_file
from agentkv_cluster.cli._simulate_args import (
    Given,
    GivenBool,
    check_args,
    check_policies,
    check_workload_memory,
)

TRACE_FORMATS = ("agentkv", "mooncake", "azure", "tracelab")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="event-level simulator of the paper's evaluation; trace replay",
        description="Compare LRU, TTL, semantic, AgentKV and ARC on the Table-3 workload "
                    "or on a replayed trace.")
    p.add_argument("--budget", type=float, default=0.35, action=Given,
                   help="HBM budget as a fraction of each batch's working set (default 0.35)")
    p.add_argument("--noise", type=float, default=0.35, action=Given,
                   help="prediction log-error sigma (default 0.35)")
    p.add_argument("--batches", type=int, default=3000, action=Given,
                   help="synthetic batches (default 3000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--policies", default="lru,ttl,semantic,agentkv,arc", action=Given,
                   help="comma-separated policies to run (default: all five)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    p.add_argument("--workload", choices=("paper", "agent-loop"), default="paper", action=Given,
                   help="synthetic preset: the paper's Table-3 batches (default) or agent "
                        "loops whose model calls re-read the whole context")
    p.add_argument("--fair", action=GivenBool, default=True,
                   help="also run every baseline acting on the end-of-life signals "
                        "(fair_policies in the JSON; default on)")
    p.add_argument("--signal-miss", type=float, default=0.0, metavar="P", action=Given,
                   help="probability that an end-of-life signal is lost (default 0)")
    p.add_argument("--signal-delay", type=float, default=0.0, metavar="S",
                   help="seconds every delivered signal is late (default 0)")
    p.add_argument("--signal-false", type=float, default=0.0, metavar="P",
                   help="probability that a page still to be read is signalled dead; "
                        "its next read pays a recompute, counted (default 0)")
    p.add_argument("--cost-error", type=float, default=0.35,
                   help="log-error sigma of the cost model's recompute estimate "
                        "(default 0.35)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep", choices=("budget", "noise", "signal"),
                      help="sweep the budget (0.20-0.70), the noise (0.05-0.90) or the "
                           "signal loss (0-0.9)")
    mode.add_argument("--ablation", action="store_true",
                      help="Table 5: AgentKV with each mechanism switched off")
    p.add_argument("--out-dir", type=Path, default=Path("."), action=Given,
                   help="folder for the PNG plots of a sweep (default: .)")
    p.add_argument("--trace", type=Path, metavar="FILE", help="replay a trace instead")
    p.add_argument("--trace-format", choices=TRACE_FORMATS, default="agentkv", action=Given,
                   help="format of --trace (default: agentkv JSON lines)")
    p.add_argument("--strict-trace", action="store_true",
                   help="fail when any trace line is malformed (default: report and skip)")
    p.add_argument("--export-trace", type=Path, metavar="OUT",
                   help="write the (converted) trace in the AgentKV format")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                   help="trace replay: a session with no event for S seconds has ended "
                        "(default: the replay's documented timeout)")
    p.add_argument("--trace-sessions", type=int, default=None, metavar="N",
                   help="trace replay: only the first N sessions (by start), whole")
    p.add_argument("--trace-skip", type=int, default=0, metavar="K",
                   help="trace replay: skip the first K sessions (a held-out part)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agentkv_cluster.sim.config import (
        SignalQuality,
        SimConfig,
        SimConfigError,
        WorkloadConfig,
    )

    check_args(args)  # a flag with no effect in this mode, trace-only flags, their values
    console = Console()
    if not console.is_terminal:  # pipes and CI logs: do not squeeze the tables to 80 columns
        console = Console(width=150)
    try:
        cfg = SimConfig(seed=args.seed, budget=args.budget, noise=args.noise,
                        cost_error=args.cost_error,
                        signals=SignalQuality(miss=args.signal_miss, delay_s=args.signal_delay,
                                              false_rate=args.signal_false),
                        workload=WorkloadConfig(batches=args.batches, preset=args.workload))
    except SimConfigError as exc:
        raise CliError(str(exc)) from None
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    check_policies(policies)
    if args.trace is not None:
        from agentkv_cluster.cli._simulate_trace import check_trace_outputs

        check_trace_outputs(args)
    else:
        check_workload_memory(cfg)  # built whole: refuse one this machine cannot hold
    check_writable_file(args.json, "--json")  # before the run, not after it
    check_writable_file(args.export_trace, "--export-trace")
    if args.sweep:
        check_writable_dir(args.out_dir, "--out-dir")
    started = time.perf_counter()
    try:
        payload = _run_mode(args, cfg, policies, console)
    except MemoryError:  # what no check foresaw: one line, not a numpy traceback
        raise CliError("out of memory: this run needs more memory than the machine has; "
                       "use fewer --batches (or --trace-sessions with --trace)") from None
    console.print(f"[dim]finished in {time.perf_counter() - started:.1f} s[/dim]")
    if args.json:
        from agentkv_cluster.sim.report import write_json

        try:
            write_json(payload, args.json)
        except OSError as exc:
            raise CliError(f"--json {args.json}: cannot write: {exc.strerror or exc}") from None
        console.print(f"wrote {args.json}")
    return 0


def _run_mode(args: argparse.Namespace, cfg: Any, policies: tuple[str, ...],
              console: Any) -> dict[str, Any]:
    """The results of the mode chosen; a trace's facts (file, format, lines, malformed
    lines, sessions, skip, idle timeout) go into the JSON of every mode, here."""
    build, trace_info = None, None
    if args.trace is not None:
        from agentkv_cluster.cli._simulate_trace import trace_builder

        build, trace_info = trace_builder(args, console)
    if args.sweep:
        payload = _sweep(args, cfg, policies, console, build)
    elif args.ablation:
        payload = _ablation(cfg, console, build)
    elif build is not None:
        payload = _replay(args, cfg, policies, console, build, trace_info)
    else:
        payload = _compare(cfg, policies, console, fair=args.fair)
    if trace_info is not None:
        payload["trace"] = trace_info
    return payload


@contextmanager
def _progress(console: Any, total: int, label: str) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not console.is_terminal:  # CI logs and pods: a plain line every 10 s instead of a bar
        lines = ProgressLines(label, total)
        yield lines.advance
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _print_config(cfg: Any, console: Any, source: str, swept: str | None = None) -> None:
    """The whole configuration; the axis a sweep varies is printed as swept, not as the
    default it never uses."""
    from rich.table import Table

    wl = cfg.workload
    link = cfg.link
    shape = (f"batches={wl.batches} x {wl.blocks_per_batch} blocks  size "
             f"{wl.size_min_mb:g}-{wl.size_max_mb:g} MB (median {wl.size_median_mb:g}, "
             f"sigma {wl.size_sigma:g})" if source.startswith("synthetic")
             else f"batches={wl.batches} from the trace")
    console.print(
        f"[bold]workload[/bold] {source}  "
        f"budget={'swept' if swept == 'budget' else cfg.budget}  "
        f"noise={'swept' if swept == 'noise' else cfg.noise}  "
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


def _margins(result: Any, console: Any) -> dict[str, Any]:
    """AgentKV against LRU (the paper's statement) and against the strongest baseline."""
    from agentkv_cluster.sim.report import margins_vs_lru

    out: dict[str, Any] = {}
    if _no_reads(result.policies.values(), console):
        return out
    if "agentkv" in result.policies and "lru" in result.policies:
        margins = margins_vs_lru(result.policies)
        out["agentkv_vs_lru"] = {k: None if v is None else round(v, 4)
                                 for k, v in margins.items()}
        console.print("AgentKV vs paper-faithful LRU: " + "  ".join(
            f"{k} n/a (LRU 0)" if v is None else
            f"{k} {v:+.2f}" if k != "hidden_pct" else f"{k} {v:.2f}"
            for k, v in margins.items()))
    strongest = result.margins()
    if strongest:
        console.print("[bold]AgentKV vs the strongest baseline[/bold] (paper-faithful or "
                      "with signals, per metric): " + "  ".join(
                          f"{metric} {m['agentkv']:.2f} vs {m['baseline']:.2f} "
                          f"({m['strongest']}, {m['change_pct']:+.1f} %)"
                          for metric, m in strongest.items() if m["change_pct"] is not None))
    return out


def _no_reads(metrics: Any, console: Any, what: str = "no policy is compared") -> bool:
    """Say so when no page was read again: every delay and hit figure is then 0."""
    if any(m.reads for m in metrics):
        return False
    console.print(f"[yellow]no page is read again in this run (0 reads): every delay and "
                  f"hit figure is 0 by construction, so {what}[/yellow]")
    return True


def _tables(result: Any, title: str, console: Any) -> None:
    _metrics_table(f"{title} — paper-faithful baselines (no end-of-life signals)",
                   result.policies, console)
    if result.fair_policies is not None:
        _metrics_table(f"{title} — baselines acting on the same end-of-life signals as "
                       f"AgentKV", result.fair_policies, console)


def _signal_line(cfg: Any, console: Any, swept: str | None = None) -> None:
    q = cfg.signals
    miss = "swept" if swept == "signal" else f"{q.miss:g}"
    console.print(f"[bold]signals[/bold] miss {miss}  delay {q.delay_s:g} s  "
                  f"false {q.false_rate:g}  cost-model error sigma {cfg.cost_error:g}")


def _compare(cfg: Any, policies: tuple[str, ...], console: Any, *,
             fair: bool) -> dict[str, Any]:
    from agentkv_cluster.sim.runner import compare, make_workload, pages, runs_per_comparison

    workload = make_workload(cfg)
    _print_config(cfg, console, workload.source)
    _signal_line(cfg, console)
    total = pages(workload) * runs_per_comparison(policies, fair)
    with _progress(console, total, "simulating") as advance:
        result = compare(cfg, workload=workload, policies=policies, fair=fair,
                         progress=advance)
    _tables(result, f"restore delay and transfer at budget {cfg.budget}, noise {cfg.noise}",
            console)
    payload = result.to_dict()
    payload.update(_margins(result, console))
    return payload


def _sweep(args: argparse.Namespace, cfg: Any, policies: tuple[str, ...],
           console: Any, build: Any) -> dict[str, Any]:
    from rich.table import Table

    from agentkv_cluster.sim import plots
    from agentkv_cluster.sim.report import sweep_rows, sweep_to_dict
    from agentkv_cluster.sim.runner import (
        BUDGET_SWEEP,
        NOISE_SWEEP,
        SIGNAL_SWEEP,
        make_workload,
        pages,
        runs_per_comparison,
        sweep,
    )

    values = {"budget": BUDGET_SWEEP, "noise": NOISE_SWEEP, "signal": SIGNAL_SWEEP}[args.sweep]
    first = (build or make_workload)(cfg)
    if build is not None:
        cfg = _trace_batches(cfg, first)
    _print_config(cfg, console, str(args.trace) if build is not None
                  else f"synthetic(seed={cfg.seed})", swept=args.sweep)
    _signal_line(cfg, console, swept=args.sweep)
    total = len(values) * pages(first) * runs_per_comparison(policies, args.fair)
    with _progress(console, total, f"sweeping {args.sweep}") as advance:
        results = sweep(cfg, args.sweep, values, policies=policies, fair=args.fair,
                        build=build or make_workload, progress=advance)
    points = [(v, r.policies) for v, r in zip(values, results)]
    _no_reads([m for _, res in points for m in res.values()], console,
              "the sweep compares no policy")
    metrics = (("byte_hit_pct", "byte hit %"), ("p95_ms", "P95 ms"),
               ("transfer_mb_per_batch", "MB/batch"), ("risk_pct", "risk %"))
    fair_points = [(v, r.fair_policies) for v, r in zip(values, results)
                   if r.fair_policies is not None]
    for label_set, pts in (("", points), (" (baselines with signals)", fair_points)):
        for metric, label in metrics if pts else ():
            header, rows = sweep_rows(args.sweep, pts, metric)
            table = Table(title=f"{label} by {args.sweep}{label_set}", title_justify="left")
            for col in header:
                table.add_column(col, justify="right")
            for row in rows:
                table.add_row(*row)
            console.print(table)
    try:
        paths, note = plots.sweep_figures(args.sweep, values, results, args.out_dir)
    except OSError as exc:
        raise CliError(f"--out-dir {args.out_dir}: cannot write the figures: "
                       f"{exc.strerror or exc}") from None
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    for path in paths:
        console.print(f"wrote {path}")
    payload = sweep_to_dict(cfg.to_dict(), args.sweep, points)
    if fair_points:
        payload["sweep"]["fair_points"] = [
            {"value": v, "policies": {n: m.to_dict() for n, m in res.items()}}
            for v, res in fair_points]
    payload["sweep"]["agentkv_vs_strongest"] = [
        {"value": v, "margins": r.margins()} for v, r in zip(values, results)]
    return payload


def _ablation(cfg: Any, console: Any, build: Any) -> dict[str, Any]:
    from rich.table import Table

    from agentkv_cluster.sim.report import PAPER_TABLE5
    from agentkv_cluster.sim.runner import ABLATIONS, ablation, make_workload, pages

    workload = (build or make_workload)(cfg)
    if build is not None:
        cfg = _trace_batches(cfg, workload)
    _print_config(cfg, console, workload.source)
    _signal_line(cfg, console)
    with _progress(console, pages(workload) * len(ABLATIONS), "ablation") as advance:
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
    _no_reads(result.rows.values(), console, "no mechanism is measured (every ratio is 1)")
    return result.to_dict()


def _trace_batches(cfg: Any, workload: Any) -> Any:
    """The trace decides the batch count (one timeline); the config printed and saved
    must say so, not the synthetic default it never used."""
    return cfg.replace(workload=dataclasses.replace(cfg.workload, batches=len(workload)))


def _replay(args: argparse.Namespace, cfg: Any, policies: tuple[str, ...],
            console: Any, build: Any, info: dict[str, Any]) -> dict[str, Any]:
    from agentkv_cluster.sim.runner import compare, pages, runs_per_comparison
    from agentkv_cluster.sim.trace.replay import describe

    workload = build(cfg)
    console.print(f"[bold]trace[/bold] {args.trace} ({args.trace_format}): "
                  f"{info['events']} events from {info['lines']} lines, "
                  f"{len(info['malformed_lines'])} malformed; {describe(workload)}")
    cfg = _trace_batches(cfg, workload)
    _print_config(cfg, console, workload.source)
    _signal_line(cfg, console)
    total = pages(workload) * runs_per_comparison(policies, args.fair)
    with _progress(console, total, "replaying") as advance:
        result = compare(cfg, workload=workload, policies=policies, fair=args.fair,
                         progress=advance)
    _tables(result, f"trace replay at budget {cfg.budget}, noise {cfg.noise}", console)
    payload = result.to_dict()
    payload.update(_margins(result, console))
    return payload
