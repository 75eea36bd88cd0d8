"""``agentkv simulate --trace``: parse (and export) a trace once for every replay."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError

MAX_REPORTED_LINES = 20


def check_trace_outputs(args: argparse.Namespace) -> None:
    """Refuse, before the run, an output that would overwrite the trace being read or
    the other output: ``--json`` or ``--export-trace`` naming the ``--trace`` file (or
    a link to it), or both naming one file."""
    outputs = [(flag, path) for flag, path in (("--json", args.json),
                                               ("--export-trace", args.export_trace)) if path]
    for flag, path in outputs:
        if _same_file(path, args.trace):
            raise CliError(f"{flag} {path} is the trace being read (--trace {args.trace}); "
                           f"writing it would destroy the trace: choose another file")
    if len(outputs) == 2 and _same_file(outputs[0][1], outputs[1][1]):
        raise CliError(f"--json and --export-trace name the same file ({args.json})")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:  # unreadable: check_writable_file and the reader say why
        return False


@contextmanager
def reading_progress(console: Any, label: str,
                     every_s: float = 10.0) -> Iterator[Callable[[int], None]]:
    """Lines read so far (a file's line count is not known before it is read): a rich
    bar on a terminal; in logs a plain line every ``every_s`` seconds and one at the
    end, when it took that long."""
    if console.is_terminal:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}: {task.completed:,.0f} "
                                                  "lines"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task(label, total=None)
            yield lambda n: bar.advance(task, n)
        return
    start = last = time.monotonic()
    done = 0

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            console.print(f"{label}: {done:,} lines after {now - start:.0f} s")

    yield advance
    if time.monotonic() - start >= every_s:
        console.print(f"{label}: {done:,} lines in {time.monotonic() - start:.0f} s")


def trace_builder(args: argparse.Namespace, console: Any) -> tuple[Any, dict[str, Any]]:
    """Parse (and export) the trace once; return (cfg -> replayed workload, trace facts)."""
    from agentkv_cluster.sim.trace.convert import load_trace
    from agentkv_cluster.sim.trace.format import TraceFormatError, read_trace, write_trace
    from agentkv_cluster.sim.trace.replay import ReplayConfig, replay_workload

    try:
        with reading_progress(console, f"reading {args.trace}") as advance:
            parsed = load_trace(args.trace, args.trace_format, progress=advance)
    except TraceFormatError as exc:
        raise CliError(str(exc)) from None
    for err in parsed.errors[:MAX_REPORTED_LINES]:
        console.print(f"[yellow]{args.trace}: {err}[/yellow]")
    if len(parsed.errors) > MAX_REPORTED_LINES:
        console.print(f"[yellow]... and {len(parsed.errors) - MAX_REPORTED_LINES} more "
                      f"malformed lines[/yellow]")
    if parsed.errors and not parsed.events:
        raise CliError(f"{args.trace}: none of its lines is a valid {args.trace_format} "
                       f"record ({len(parsed.errors)} malformed; first: {parsed.errors[0]}); "
                       f"is --trace-format {args.trace_format} the file's format?")
    if parsed.errors and args.strict_trace:
        raise CliError(f"{args.trace}: {len(parsed.errors)} malformed line(s); first: "
                       f"{parsed.errors[0]}")
    if args.export_trace:
        try:
            n = write_trace(parsed.events, args.export_trace)
        except OSError as exc:
            raise CliError(f"--export-trace {args.export_trace}: cannot write: "
                           f"{exc.strerror or exc}") from None
        again = read_trace(args.export_trace)
        if again.errors or len(again.events) != n:  # the export must always reload
            raise CliError(f"{args.export_trace}: the exported trace does not reload "
                           f"({len(again.errors)} bad lines; first: "
                           f"{again.errors[0] if again.errors else 'count mismatch'})")
        console.print(f"wrote {n} events to {args.export_trace} (reloads cleanly)")
    kw = {} if args.idle_timeout is None else {"idle_timeout_s": args.idle_timeout}
    rc = ReplayConfig(sessions=args.trace_sessions, skip=args.trace_skip, **kw)
    info = {
        "file": str(args.trace), "format": args.trace_format, "events": len(parsed.events),
        "lines": parsed.lines, "idle_timeout_s": rc.idle_timeout_s,
        "sessions": rc.sessions, "skip": rc.skip, "kv_bytes_per_token": rc.kv_bytes_per_token,
        "malformed_lines": [{"line": e.line, "reason": e.reason} for e in parsed.errors],
    }

    building = f"building the timeline of {len(parsed.events):,} events"
    if not console.is_terminal:  # logs: a status line draws nothing; say it once
        console.print(building)

    def build(cfg: Any) -> Any:
        try:
            with console.status(building):
                return replay_workload(parsed.events, cfg, source=str(args.trace), rc=rc)
        except TraceFormatError as exc:
            raise CliError(str(exc)) from None

    return build, info
