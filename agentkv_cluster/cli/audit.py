"""``agentkv audit``: offline checks of the audit log and erasure receipts, and isolation probes.

The logic lives in ``security``; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentkv_cluster.cli import (
    CliError,
    add_state_dir,
    check_writable_dir,
    check_writable_file,
    redact_url,
)

if TYPE_CHECKING:
    from security.erasure import BegunErasure

MAX_PROBE_ROUNDS = 100_000  # audit isolation --rounds: lookups per timing distribution


def _e(value: object) -> str:
    """``value`` as text fit for a Rich markup string: paths, tenant names, URLs and the
    messages of logs and receipts are not ours ("a[/b]log" would be a closing tag, a
    MarkupError traceback; "[i]log" would print as "log")."""
    from rich.markup import escape

    return escape(str(value))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("audit", help="verify audit logs and erasure receipts; probe isolation")
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    verify = sub.add_parser("verify", help="verify an audit log offline with only the public key")
    verify.add_argument("log", type=Path, metavar="LOG", nargs="?",
                        help="the audit log (default STATE_DIR/audit.log)")
    verify.add_argument("--public-key", type=Path, metavar="F",
                        help="the audit public key (PEM), as `audit keygen --public` wrote it "
                             "(default STATE_DIR/audit.pub)")
    add_state_dir(verify)
    verify.add_argument("--anchor", type=Path, action="append", default=[], metavar="RECEIPT",
                        help="an erasure receipt the log must still contain (detects rollback)")
    verify.set_defaults(handler=_verify)

    receipt = sub.add_parser("receipt", help="verify an erasure receipt offline")
    receipt.add_argument("receipt", type=Path, metavar="RECEIPT")
    receipt.add_argument("--public-key", type=Path, metavar="F",
                         help="the audit public key (PEM) the receipt was signed for "
                              "(default STATE_DIR/audit.pub)")
    add_state_dir(receipt)
    receipt.add_argument("--log", type=Path, help="also check that this audit log holds the receipt")
    receipt.set_defaults(handler=_receipt)

    iso = sub.add_parser("isolation", help="run the tenant-isolation probes against a live Redis")
    iso.add_argument("--redis-url", required=True, metavar="URL", help="an admin connection")
    iso.add_argument("--keys-dir", type=Path, help="key directory for the throw-away probe tenants")
    iso.add_argument("--rounds", type=int, default=200, help="lookups per timing distribution")
    iso.add_argument("--tool-name", action="append", default=[], help="a tool name that must not be stored")
    iso.set_defaults(handler=_isolation)

    erased = sub.add_parser("erased", help="check that no erased tenant's directory "
                            "namespace holds a key in Redis")
    erased.add_argument("--keys-dir", type=Path, required=True, metavar="D",
                        help="the service's tenant key directory (read only: erasure marks)")
    erased.add_argument("--redis-url", required=True, metavar="URL", help="an admin connection")
    # The same default as `tenant erase --redis-prefix` and the service: a check under
    # another prefix than the one erased would find nothing there and pass.
    erased.add_argument("--redis-prefix", metavar="P",
                        default=os.environ.get("AGENTKV_DIRECTORY_PREFIX", "akv"),
                        help="the service's directory.prefix (default "
                             "$AGENTKV_DIRECTORY_PREFIX or akv)")
    erased.add_argument("--log", type=Path, metavar="LOG",
                        help="also fail each erasure this audit log says began and never "
                             "recorded its end (no receipt yet)")
    erased.set_defaults(handler=_erased)

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key pair (PEM)")
    keygen.add_argument("--private", type=Path, required=True, metavar="F",
                        help="write the private key here (PEM, 0600): serve --signing-key")
    keygen.add_argument("--public", type=Path, required=True, metavar="F",
                        help="write the public key here (PEM): verifies logs and receipts")
    keygen.set_defaults(handler=_keygen)


def _verifier(path: Path):
    from security.errors import InvalidSigningKey
    from security.signing import load_verifier

    try:
        return load_verifier(path)
    except InvalidSigningKey as exc:
        raise CliError(str(exc)) from None


def _load_receipt(path: Path, verifier):
    from security.erasure import verify_receipt
    from security.errors import InvalidReceipt

    try:
        text = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read receipt {path}: {exc.strerror}") from None
    try:
        return verify_receipt(text, verifier), None
    except InvalidReceipt as exc:
        return None, str(exc)


def _verify_log(path: Path, verifier, anchors: Iterable, flag: str):
    """``verify_log`` with a clean error for a path that is not a readable file."""
    from security.audit import verify_log

    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory, not an audit log file")
    try:
        return verify_log(path, verifier, anchors=anchors)
    except OSError as exc:
        raise CliError(f"cannot read audit log {path}: {exc.strerror}") from None


def _verify(args: argparse.Namespace) -> int:
    from rich.console import Console

    from security.erasure import unfinished_erasures

    verifier = _verifier(args.public_key)
    anchors = []
    for path in args.anchor:
        receipt, problem = _load_receipt(path, verifier)
        if receipt is None:
            raise CliError(f"anchor {path} is not a valid receipt: {problem}")
        anchors.append(receipt.audit_position())
    report = _verify_log(args.log, verifier, anchors, "LOG")
    console = Console(soft_wrap=True)
    status = "[green]PASS[/green]" if report.ok else "[red]FAIL[/red]"
    console.print(f"{status} {_e(args.log)}: {report.records} records, {report.checkpoints} signed "
                  f"checkpoints, head {report.head[:16]}")
    for problem in report.problems:
        console.print(f"  [red]-[/red] {_e(problem)}")
    for begun in unfinished_erasures(args.log):
        erasure, detail = _unfinished_lines(begun)
        console.print(f"  [yellow]unfinished[/yellow] {_e(erasure)}: {_e(detail)}")
    return 0 if report.ok else 1


def _receipt(args: argparse.Namespace) -> int:
    from rich.console import Console

    verifier = _verifier(args.public_key)
    receipt, problem = _load_receipt(args.receipt, verifier)
    console = Console(soft_wrap=True)
    if receipt is None:
        console.print(f"[red]FAIL[/red] {_e(args.receipt)}: {_e(problem)}")
        return 1
    counts = ", ".join(f"{tier}={n}" for tier, n in receipt.counts) or "none"
    what = (f"erasure of {receipt.scope} {receipt.tenant}"
            f"{'' if receipt.generation is None else f' g{receipt.generation}'}: "
            f"keys {', '.join(receipt.key_ids) or 'none'}; pages {counts}; "
            f"audit seq {receipt.audit_seq}")  # signed, yet the signer's text, not markup
    console.print(f"[green]PASS[/green] {_e(what)}")
    if args.log is not None:
        report = _verify_log(args.log, verifier, [receipt.audit_position()], "--log")
        if not report.ok:
            console.print(f"[red]FAIL[/red] audit log: {_e('; '.join(report.problems))}")
            return 1
        console.print(f"[green]PASS[/green] audit log {_e(args.log)} holds the erasure record")
    return 0


def tenant_url(url: str, username: str, password: str) -> str:
    """``url`` (redis://, rediss:// or unix://, with its query options) as another user."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(username, safe='')}:{quote(password, safe='')}@{host}"))


def tenant_connector(admin: Any, url: str) -> Callable[[str, str], Any]:
    """Per-tenant clients reaching the server the way ``admin`` does: same socket or host,
    TLS and options, only the user differs."""

    def connect(username: str, password: str) -> Any:
        return type(admin).from_url(tenant_url(url, username, password))

    return connect


def _is_redis_error(exc: BaseException) -> bool:
    return type(exc).__module__.partition(".")[0] == "redis"  # this module does not import redis


def _isolation(args: argparse.Namespace) -> int:
    import tempfile
    import time

    from rich.console import Console
    from rich.table import Table

    from agentkv_cluster.cli._redis_admin import connect_admin
    from security.isolation import run_probes
    from security.keyring import FileKeySource, TenantKeyring

    if not 10 <= args.rounds <= MAX_PROBE_ROUNDS:
        raise CliError(f"--rounds must be 10..{MAX_PROBE_ROUNDS}")
    if args.keys_dir is not None:
        if args.keys_dir.exists() and not args.keys_dir.is_dir():
            raise CliError(f"--keys-dir {args.keys_dir} is a file, not a directory")
        check_writable_dir(args.keys_dir, "--keys-dir")
    shown = redact_url(args.redis_url)
    admin = connect_admin(args.redis_url)
    with tempfile.TemporaryDirectory(prefix="agentkv-probe-keys-") as tmp:
        try:
            keyring = TenantKeyring(FileKeySource(args.keys_dir or tmp))
        except OSError as exc:
            raise CliError(f"--keys-dir {args.keys_dir}: cannot create "
                           f"{exc.filename or args.keys_dir}: {exc.strerror}") from None
        try:
            results = run_probes(admin, tenant_connector(admin, args.redis_url), keyring,
                                 now=time.time(), rounds=args.rounds, markers_extra=args.tool_name)
        except Exception as exc:
            if not _is_redis_error(exc):
                raise
            raise CliError(f"isolation probes against {shown} failed: "
                           f"{str(exc).replace(args.redis_url, shown)}") from None
    table = Table(title=f"tenant isolation probes: {_e(shown)}")
    for column in ("probe", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(_e(r.name), "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]",
                      _e(r.detail))
    Console().print(table)
    failed = sum(not r.passed for r in results)
    Console().print(f"{len(results) - failed}/{len(results)} probes passed")
    return 0 if failed == 0 else 1


def _erased(args: argparse.Namespace) -> int:
    """Each erased tenant whose mark names its blinded namespace: PASS when Redis holds no
    key of it (a Redis restored from an older snapshot would), else FAIL with the count.
    Tenants erased before marks named the namespace cannot be checked; they are listed.
    With ``--log``, each erasure that log says began and never ended FAILs as well."""
    from rich.console import Console

    from agentkv_cluster.cli._redis_admin import check_prefix, connect_admin, keys_by_namespace
    from security.errors import SecurityError
    from security.keyring import FileKeySource, TenantKeyring

    try:
        keyring = TenantKeyring(FileKeySource(args.keys_dir, writable=False))
        named, erasures = keyring.erased_directory_namespaces(), keyring.erasures()
    except SecurityError as exc:
        raise CliError(f"--keys-dir {args.keys_dir}: {exc}") from None
    unfinished = _unfinished(args.log)
    check_prefix(args.redis_prefix)
    shown = redact_url(args.redis_url)
    admin = connect_admin(args.redis_url)
    try:
        held = keys_by_namespace(admin, args.redis_prefix, {ns for _t, ns in named})
    except Exception as exc:
        if not _is_redis_error(exc):
            raise
        raise CliError(f"reading the directory at {shown} failed: "
                       f"{str(exc).replace(args.redis_url, shown)}") from None
    finally:
        admin.close()
    console = Console(soft_wrap=True)
    for tenant, ns in named:
        if held[ns]:
            console.print(f"[red]FAIL[/red] {_e(tenant)} ({_e(ns)}): {held[ns]} key(s) left in {_e(shown)} "
                          "(a snapshot older than the erasure?); the service deletes them "
                          "again when it starts or sees the directory restart")
        else:
            console.print(f"[green]PASS[/green] {_e(tenant)} ({_e(ns)}): no key left")
    unnamed = sorted(set(erasures) - {t for t, _ns in named})
    if unnamed:
        console.print(f"not checked (erased before marks named the namespace): "
                      f"{_e(', '.join(unnamed))}")
    failed = sum(1 for _t, ns in named if held[ns])
    console.print(f"{len(named) - failed}/{len(named)} erased namespaces hold no key")
    for begun in unfinished:
        erasure, detail = _unfinished_lines(begun, f" of {args.log}")
        console.print(f"[red]FAIL[/red] {_e(erasure)} unfinished: {_e(detail)}")
    return 0 if failed == 0 and not unfinished else 1


def _unfinished_lines(begun: BegunErasure, where: str = "") -> tuple[str, str]:
    """Which erasure ``begun`` is, and what to do about it."""
    what = "tenant" if begun.generation is None else f"generation {begun.generation} of"
    detail = (f"begun at record {begun.seq}{where}, its end never recorded (no receipt); "
              "run the same `agentkv tenant erase` again to finish it")
    return f"erasure of {what} {begun.tenant}", detail


def _unfinished(path: Path | None) -> list[BegunErasure]:
    """The erasures the audit log at ``path`` says began and never ended (none: no log)."""
    from security.erasure import unfinished_erasures

    if path is None:
        return []
    if not path.is_file():
        raise CliError(f"--log {path} is not an audit log file")
    try:
        return unfinished_erasures(path)
    except OSError as exc:
        raise CliError(f"cannot read audit log {path}: {exc.strerror}") from None


def _keygen(args: argparse.Namespace) -> int:
    from security.errors import InvalidSigningKey
    from security.signing import fingerprint, write_keypair

    if args.private.resolve() == args.public.resolve():
        raise CliError(f"--private and --public are both {args.private}: the public key would "
                       "overwrite the private one")
    check_writable_file(args.private, "--private")
    check_writable_file(args.public, "--public")
    for flag, path in (("--private", args.private), ("--public", args.public)):
        if path.exists():
            raise CliError(f"{flag} {path} exists; keygen never replaces a file (a signing "
                           "key, or the public key earlier receipts verify with)")
    try:
        signer = write_keypair(args.private, args.public)  # both files or neither
    except InvalidSigningKey as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write the key pair ({exc.filename}: {exc.strerror}); "
                       "nothing was written") from None
    print(f"wrote {args.private} (private, 0600) and {args.public}; key {fingerprint(signer.public_raw())}")
    return 0
