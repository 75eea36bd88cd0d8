"""The ``agentkv`` command line.

Each command group lives in its own module that exposes ``register(subparsers)``;
heavy imports (ray, torch, the model) happen inside the command handlers so that
``agentkv --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Module name -> one-line summary; each module adds its own subcommands.
COMMAND_MODULES: tuple[str, ...] = (
    "agentkv_cluster.cli.simulate",
    "agentkv_cluster.cli.demo",
    "agentkv_cluster.cli.serve",
    "agentkv_cluster.cli.audit",
    "agentkv_cluster.cli.tenant",
)


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentkv",
        description="Lifecycle-aware KV-cache service for agentic LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except CliError as exc:
        print(f"agentkv {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
