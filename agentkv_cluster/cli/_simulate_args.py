"""``agentkv simulate``: which flags the user gave, and the checks of flags against the mode.

A flag that has no effect in the mode chosen is refused (exit 2, one line naming
the flag and why) when the user gave it; a default nobody typed is never refused.
``Given`` and ``GivenBool`` record each flag typed on the command line in
``args.given_flags`` (dest -> the option string as typed); argparse applies
defaults without calling them.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from agentkv_cluster.cli import CliError

GIVEN = "given_flags"


def _remember(namespace: argparse.Namespace, dest: str, option: str | None) -> None:
    given = getattr(namespace, GIVEN, None)
    if given is None:
        given = {}
        setattr(namespace, GIVEN, given)
    given[dest] = option or dest


class Given(argparse.Action):
    """``store``, remembering that the flag was typed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _remember(namespace, self.dest, option_string)


class GivenBool(argparse.BooleanOptionalAction):
    """``--x/--no-x``, remembering which of the two was typed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _remember(namespace, self.dest, option_string)


def unused_flags(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(dest, why) for every flag that has no effect in the mode of ``args``."""
    from agentkv_cluster.sim.runner import BUDGET_SWEEP, NOISE_SWEEP, SIGNAL_SWEEP

    def span(values: tuple[float, ...]) -> str:
        return f"{min(values):g}-{max(values):g}"

    rules = (
        ("budget", args.sweep == "budget",
         f"--sweep budget sets the budget of each point ({span(BUDGET_SWEEP)})"),
        ("noise", args.sweep == "noise",
         f"--sweep noise sets the noise of each point ({span(NOISE_SWEEP)})"),
        ("signal_miss", args.sweep == "signal",
         f"--sweep signal sets the signal loss of each point ({span(SIGNAL_SWEEP)})"),
        ("policies", args.ablation,
         "--ablation runs AgentKV alone, with each mechanism switched off in turn"),
        ("fair", args.ablation, "--ablation runs no baseline"),
        ("workload", args.trace is not None,
         "--trace replays the trace instead of a synthetic preset"),
        ("batches", args.trace is not None,
         "--trace replays the whole trace (or --trace-sessions of it) as one timeline"),
        ("out_dir", not args.sweep, "only --sweep writes figures"),
        ("trace_format", args.trace is None, "it names the format of --trace, not given"),
    )
    return [(dest, why) for dest, idle, why in rules if idle]


def check_args(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, a flag given in a mode where it has no effect and
    the trace-only flags without ``--trace``; check their values."""
    given = getattr(args, GIVEN, {})
    for dest, why in unused_flags(args):
        if dest in given:
            raise CliError(f"{given[dest]} has no effect here: {why}; leave it out")
    if args.trace is None and (args.export_trace or args.strict_trace or args.idle_timeout
                               is not None or args.trace_sessions is not None
                               or args.trace_skip):
        raise CliError("--export-trace, --strict-trace, --idle-timeout, --trace-sessions and "
                       "--trace-skip need --trace")
    if args.idle_timeout is not None and not (args.idle_timeout > 0
                                              and math.isfinite(args.idle_timeout)):
        raise CliError("--idle-timeout must be a finite number > 0")
    if args.trace_sessions is not None and args.trace_sessions < 1:
        raise CliError("--trace-sessions must be >= 1")
    if args.trace_skip < 0:
        raise CliError("--trace-skip must be >= 0")


def check_policies(policies: tuple[str, ...]) -> None:
    """Unknown names and names given twice are refused (a duplicate would run the same
    policy again and print one row: a typo for another policy, most likely)."""
    from agentkv_cluster.sim.policies import POLICY_NAMES
    from agentkv_cluster.sim.runner import DuplicatePolicy, check_policy_names

    if not policies:
        raise CliError(f"--policies names no policy; known: {', '.join(POLICY_NAMES)}")
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        raise CliError(f"unknown policy {', '.join(unknown)}; "
                       f"known: {', '.join(POLICY_NAMES)}")
    try:
        check_policy_names(policies)
    except DuplicatePolicy as exc:
        raise CliError(f"--policies: {exc}") from None


def _physical_memory() -> int | None:
    """Bytes of memory this machine has (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_workload_memory(cfg: Any) -> None:
    """Refuse, before anything is allocated, a synthetic workload whose arrays alone need
    more memory than the machine has: the workload is built whole, and numpy would fail
    with a traceback after the run started (or the system would kill it). The bytes per
    batch are those of a two-batch workload of the same preset, a lower bound."""
    import dataclasses

    from agentkv_cluster.sim.runner import make_workload

    have = _physical_memory()
    wl = cfg.workload
    if have is None or wl.batches <= 2:
        return
    sample = make_workload(cfg.replace(workload=dataclasses.replace(wl, batches=2)))
    per_batch = sum(_array_bytes(b) for b in sample) / len(sample)
    need = per_batch * wl.batches
    if need > have:
        raise CliError(f"--batches {wl.batches:,} needs at least {need / 1e9:,.1f} GB for "
                       f"its workload ({per_batch / 1e3:,.1f} kB a batch), more than this "
                       f"machine's {have / 1e9:,.1f} GB; use fewer batches")


def _array_bytes(batch: Any) -> int:
    """Bytes of the numpy arrays a batch holds (directly or in tuples of them)."""
    import dataclasses

    import numpy as np

    total = 0
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, np.ndarray):
                total += item.nbytes
    return total
