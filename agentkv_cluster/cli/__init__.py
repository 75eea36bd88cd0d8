"""The ``agentkv`` command line.

Each command group lives in its own module that exposes ``register(subparsers)``;
heavy imports (ray, torch, the model) happen inside the command handlers so that
``agentkv --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

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


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("agentkv-cluster")
    except PackageNotFoundError:  # a source tree without an install
        return "unknown"


# Path options that default to a file in the state directory (serve writes them there).
STATE_FILES = {"keys_dir": "keys", "token_secret_file": "token.secret",
               "signing_key": "audit.key", "audit_log": "audit.log", "public_key": "audit.pub"}


def add_state_dir(parser: argparse.ArgumentParser) -> None:
    """``--state-dir``: where this command finds what ``agentkv serve`` keeps (keys, token
    secret, audit key pair and log) when their own options are not given."""
    parser.add_argument("--state-dir", type=Path, metavar="DIR",
                        help="state directory of `agentkv serve` (default $AGENTKV_STATE_DIR, "
                             "else $XDG_STATE_HOME/agentkv, i.e. ~/.local/state/agentkv)")


def state_dir(args: argparse.Namespace) -> Path:
    from agentkv_cluster.config import default_state_dir

    if getattr(args, "state_dir", None) is not None:
        return Path(args.state_dir).expanduser()
    env = os.environ.get("AGENTKV_STATE_DIR")
    return Path(env).expanduser() if env else default_state_dir()


def apply_state_defaults(args: argparse.Namespace) -> None:
    """Fill unset path options of a command that takes ``--state-dir`` from that directory.
    The audit pair (log and signing key) is filled only together, and only for a command that
    requires it or when the state directory holds the key (``--audit-log`` stays optional)."""
    if not hasattr(args, "state_dir") or args.command == "serve":
        return
    root = state_dir(args)
    for name, file in STATE_FILES.items():
        if name in ("signing_key", "audit_log") or getattr(args, name, "x") is not None:
            continue
        setattr(args, name, root / file)
    if getattr(args, "audit_command", None) == "verify" and args.log is None:
        args.log = root / "audit.log"
    unset = hasattr(args, "signing_key") and args.signing_key is None and args.audit_log is None
    if unset and (getattr(args, "audit_required", False) or (root / "audit.key").is_file()):
        args.signing_key, args.audit_log = root / "audit.key", root / "audit.log"


def _cannot_create_in(folder: Path) -> str | None:
    """Why no file can be created in ``folder``, or None when one can: a real create (of
    a temporary file, removed at once), since permission bits do not tell (root passes
    ``os.access`` on /proc, /sys and read-only mounts alike)."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".agentkv-write-check-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def check_writable_file(path: Path | None, flag: str) -> None:
    """Fail before a long run when its output file cannot be written (a directory, a missing
    or read-only folder, a file system that holds no new files). Nothing is left behind:
    an existing file is opened for writing without truncating it, a new one is tried with a
    temporary file in its folder; the run writes the file at its end."""
    if path is None:
        return
    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory, not a file")
    if path.exists():
        if not path.is_file():  # /dev/stdout, a FIFO: opening one now could block or fail
            if not os.access(path, os.W_OK):
                raise CliError(f"{flag} {path} is not writable")
            return
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY))
        except OSError as exc:
            raise CliError(f"{flag} {path} is not writable ({exc.strerror or exc})") from None
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: folder {parent} does not exist")
    why = _cannot_create_in(parent)
    if why is not None:
        raise CliError(f"{flag} {path}: folder {parent} is not writable (creating a file "
                       f"there fails: {why})")


def check_writable_dir(path: Path | None, flag: str) -> None:
    """Like ``check_writable_file`` for an output folder (created later if missing): a file
    can be created in it, or in the nearest folder above it that exists."""
    if path is None:
        return
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CliError(f"{flag} {path}: {probe} is not a directory")
    why = _cannot_create_in(probe)
    if why is not None:
        raise CliError(f"{flag} {path}: {probe} is not writable (creating a file there "
                       f"fails: {why})")


def emit(text: str) -> None:
    """Write ``text`` to standard output now; ``OSError`` (a full disk, a closed pipe) as is,
    for the caller to say what it means (a token lost, a receipt to print again)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def redact_url(url: str) -> str:
    """``url`` fit to print or log: its password (in the user part or a ``password=`` query
    argument, both of which redis-py reads) replaced by ``***``."""
    import re
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class ProgressLines:
    """Progress for logs: when output is not a terminal (CI, pods) a rich bar draws nothing,
    so print one plain line every ``every_s`` seconds instead: ``label: done/total (pct)``."""

    def __init__(self, label: str, total: int, every_s: float = 10.0,
                 write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.every_s = label, total, every_s
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self.done = 0
        self._start = self._last = clock()

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            self.write(f"{self.label}: {self.done}/{self.total} ({pct:.0f}%) after "
                       f"{now - self._start:.0f} s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentkv",
        description="Lifecycle-aware KV-cache service for agentic LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"agentkv {version()}",
                        help="print the version and exit")
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
    apply_state_defaults(args)
    on_term = args.command in TERM_UNWINDS and threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if on_term else None  # cleanup runs
    try:
        return int(handler(args) or 0)
    except CliError as exc:
        print(f"agentkv {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM for a command in TERM_UNWINDS
        print(f"agentkv {args.command}: interrupted{INTERRUPTED.get(args.command, '')}",
              file=sys.stderr)
        return 130
    finally:
        if on_term:
            signal.signal(signal.SIGTERM, before)


# Commands that change or probe state an admin relies on (keys, audit log, Redis ACL users).
ADMIN_COMMANDS = ("audit", "tenant")
# Commands whose cleanup must run on SIGTERM too (`timeout`, a CI job cancelled, a pod
# stopped): the admin commands, and the demo, which otherwise leaves its 256 MiB host pool
# in /dev/shm, its temporary folder (keys, NVMe shard) and two Ray agent processes behind.
TERM_UNWINDS = (*ADMIN_COMMANDS, "demo")
INTERRUPTED = {"tenant": "; an erasure it had begun is listed as unfinished by `agentkv audit "
                         "verify`, and the same command run again finishes it"}


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the command's ``finally`` blocks


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
