"""``agentkv tenant``: create, rotate and erase tenant keys (crypto-shredding with a receipt),
grant or revoke publishing into PUBLIC, issue client tokens and print a tenant's blinded
directory namespace."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agentkv_cluster.cli import (
    CliError,
    add_state_dir,
    check_writable_dir,
    check_writable_file,
    emit,
)

if TYPE_CHECKING:
    from security.erasure import Eraser, ErasureReceipt
    from security.keyring import TenantKeyring

MAX_TOKEN_TTL_S = 366 * 86400.0  # a token lives at most a year (rotate the secret to revoke)
MAX_RETRY_S = 86400.0  # tenant erase --retry-s: at most a day of waiting for Redis


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tenant", help="manage tenants: create, rotate, erase, publish, token, namespace")
    sub = parser.add_subparsers(dest="tenant_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser, audit_required: bool) -> None:
        p.add_argument("tenant", metavar="TENANT", help="tenant name "
                       "([a-z0-9][a-z0-9_-]{0,62}), or _public: the PUBLIC namespace's keys")
        p.add_argument("--keys-dir", type=Path, metavar="D",
                       help="key directory (FileKeySource; a mounted Secret is read-only; "
                            "default STATE_DIR/keys)")
        p.add_argument("--audit-log", type=Path, metavar="F",
                       help="append-only audit log to record the action in (default "
                            "STATE_DIR/audit.log when STATE_DIR/audit.key exists"
                            + (", which erase needs)" if audit_required else ")"))
        p.add_argument("--signing-key", type=Path, metavar="F",
                       help="Ed25519 private key (PEM) for checkpoints and receipts "
                            "(default STATE_DIR/audit.key)")
        add_state_dir(p)
        p.set_defaults(audit_required=audit_required)

    create = sub.add_parser("create", help="create a tenant's blinding secret and generation 1")
    common(create, audit_required=False)
    create.set_defaults(handler=_create)

    rotate = sub.add_parser("rotate", help="add a new key generation (older ones stay readable)")
    common(rotate, audit_required=False)
    rotate.set_defaults(handler=_rotate)

    erase = sub.add_parser("erase", help="crypto-shred a tenant (or one generation) and sign a receipt")
    common(erase, audit_required=True)
    erase.add_argument("--generation", type=int, metavar="G", help="erase only this generation")
    erase.add_argument("--redis-url", metavar="URL",
                       help="also delete the tenant's directory keys (admin connection)")
    erase.add_argument("--redis-prefix", metavar="P",
                       default=os.environ.get("AGENTKV_DIRECTORY_PREFIX", "akv"),
                       help="the service's directory.prefix (default $AGENTKV_DIRECTORY_PREFIX "
                            "or akv)")
    erase.add_argument("--retry-s", type=float, metavar="S",
                       help="with --redis-url: how long an unreachable Redis is retried "
                            "before the erase gives up, having destroyed no key (default: as "
                            "the service's own erasure, 60)")
    erase.add_argument("--receipt-out", type=Path, metavar="F",
                       help="write the receipt here too: a new file (an existing one is never "
                            "replaced), or a device or pipe")
    erase.set_defaults(handler=_erase)

    publish = sub.add_parser(
        "publish", help="grant (or --revoke) a tenant the right to write the PUBLIC namespace; "
                        "recorded in the audit log")
    common(publish, audit_required=True)
    publish.add_argument("--revoke", action="store_true", help="take the grant back")
    publish.set_defaults(handler=_publish)

    publishers = sub.add_parser("publishers", help="list the tenants granted publishing")
    publishers.add_argument("--keys-dir", type=Path, metavar="D",
                            help="key directory (read only; default STATE_DIR/keys)")
    add_state_dir(publishers)
    publishers.set_defaults(handler=_publishers)

    token = sub.add_parser("token", help="issue a client token for a tenant (HMAC, like serve)")
    token.add_argument("tenant", metavar="TENANT", help="tenant the token acts for")
    token.add_argument("--token-secret-file", metavar="F",
                       help="the same secret file `agentkv serve --token-secret-file` reads "
                            "(default STATE_DIR/token.secret)")
    add_state_dir(token)
    token.add_argument("--ttl", type=float, default=86400.0, metavar="S",
                       help="lifetime in seconds (default 86400)")
    token.add_argument("--subject", default="agent", help="who holds it (default: agent)")
    token.add_argument("--public-read", action="store_true",
                       help="the tenant opted in to reading the PUBLIC namespace")
    token.add_argument("--admin", action="store_true", help="add the admin role")
    token.add_argument("--publish", action="store_true",
                       help="add the publish role (implies --admin): may write PUBLIC while "
                            "the tenant holds a grant (`agentkv tenant publish`)")
    token.set_defaults(handler=_token)

    ns = sub.add_parser("namespace", help="print the tenant's blinded directory (Redis) namespace")
    ns.add_argument("tenant", metavar="TENANT")
    ns.add_argument("--keys-dir", type=Path, metavar="D",
                    help="key directory (read only; default STATE_DIR/keys)")
    add_state_dir(ns)
    ns.set_defaults(handler=_namespace)


def _keyring(keys_dir: Path):
    from security.keyring import FileKeySource, TenantKeyring

    if keys_dir.exists() and not keys_dir.is_dir():
        raise CliError(f"--keys-dir {keys_dir} is a file, not a directory")
    if not keys_dir.is_dir():
        raise CliError(f"key directory {keys_dir} does not exist")
    return TenantKeyring(FileKeySource(keys_dir))


def _audit(args: argparse.Namespace):
    """The audit log and signer, or (None, None) when neither option is given."""
    from security.audit import AuditLog
    from security.errors import AuditLogError, InvalidSigningKey
    from security.signing import load_signer

    if args.audit_log is None and args.signing_key is None:
        return None, None
    if args.audit_log is None or args.signing_key is None:
        raise CliError("--audit-log and --signing-key go together")
    if Path(args.audit_log).is_dir():
        raise CliError(f"--audit-log {args.audit_log} is a directory, not a file")
    try:
        signer = load_signer(args.signing_key)
        return AuditLog(args.audit_log, signer, checkpoint_every=1), signer
    except (InvalidSigningKey, AuditLogError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot open the audit log or signing key: {exc}") from None


def _run(action, args: argparse.Namespace, kind: str) -> int:
    from security.errors import SecurityError

    audit, _ = _audit(args)
    try:
        generation = action(args.tenant)
        if audit is not None:
            audit.append(kind, {"tenant": args.tenant, "generation": generation}, time.time())
    except SecurityError as exc:
        raise CliError(str(exc)) from None
    finally:
        if audit is not None:
            audit.close()
    print(f"{kind}: tenant {args.tenant} generation {generation}")
    return 0


def _make_keys_dir(path: Path) -> None:
    """Create the key directory (0700) and any missing parents; on failure remove the
    folders made so far and report it in one line."""
    if path.exists() and not path.is_dir():
        raise CliError(f"--keys-dir {path} is a file, not a directory")
    check_writable_dir(path, "--keys-dir")
    missing = [p for p in (path, *path.parents) if not p.exists()]
    made: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir(mode=0o700)
            made.append(folder)
    except OSError as exc:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise CliError(f"--keys-dir {path}: cannot create {exc.filename or path}: {exc.strerror}") from None


def _create(args: argparse.Namespace) -> int:
    _make_keys_dir(args.keys_dir)
    return _run(_keyring(args.keys_dir).create_tenant, args, "key.create")


def _rotate(args: argparse.Namespace) -> int:
    from security.errors import KeyUnavailable

    keyring = _keyring(args.keys_dir)

    def rotate(tenant: str) -> int:
        try:
            return keyring.rotate(tenant)
        except KeyUnavailable as exc:  # none yet, or erased: create is what provisions it
            raise KeyUnavailable(f"{exc}; `agentkv tenant create {tenant}` provisions "
                                 "it") from None

    return _run(rotate, args, "key.rotate")


def _erase(args: argparse.Namespace) -> int:
    from security.erasure import Eraser
    from security.errors import SecurityError

    _check_receipt_out(args.receipt_out)  # before any key is destroyed
    keyring = _keyring(args.keys_dir)
    audit, signer = _audit(args)
    if audit is None or signer is None:
        raise CliError("erase records its receipt: give --audit-log and --signing-key")
    if args.retry_s is not None and args.redis_url is None:
        raise CliError("--retry-s goes with --redis-url (how long its directory step retries)")
    directory_done = False
    try:
        eraser = Eraser(keyring, audit, signer, clock=time.time)
        if args.redis_url is not None:
            step = _directory_step(args, keyring, eraser)

            def directory(_scope: object) -> int:
                nonlocal directory_done
                try:
                    removed = step()
                except CliError as exc:  # after the erasure's begun record
                    raise CliError(f"{exc} (until then `agentkv audit verify` lists the "
                                   "erasure as unfinished)") from None
                directory_done = True
                return removed

            # Run by the erasure after its ``erasure.begun`` record and before any key goes:
            # a directory step cut off is then an unfinished erasure in the log, which the
            # same command finishes.
            eraser.register_tier("directory", directory, before_keys=True)
        now = time.time()
        if args.generation is None:
            receipt = eraser.erase_tenant(args.tenant, now)
        else:
            receipt = eraser.erase_generation(args.tenant, args.generation, now)
    except SecurityError as exc:
        receipt = None if directory_done else _reissued(eraser, args, exc)
        if receipt is None:
            done = "; the tenant's directory entries were deleted before it" \
                if directory_done else ""
            raise CliError(f"{exc}{done}") from None
    finally:
        audit.close()
    text = receipt.to_json() + "\n"
    try:
        emit(text)  # first: the signed receipt is never lost to a failed file write
    except OSError as exc:
        try:
            _write_receipt(args.receipt_out, text)
            saved = f"; it is in {args.receipt_out}" if args.receipt_out else ""
        except CliError:
            saved = ""
        raise CliError(f"keys destroyed, but the receipt could not be printed ({exc.strerror})"
                       f"{saved}; `agentkv tenant erase {args.tenant}` run again with the same "
                       "options prints it (signed again from its audit record)") from None
    if receipt.failed_tiers:
        print(f"warning: keys destroyed, but deleting pages failed in: {', '.join(receipt.failed_tiers)}"
              " (what is left there is ciphertext under destroyed keys)", file=sys.stderr)
    _write_receipt(args.receipt_out, text)
    return 1 if receipt.failed_tiers else 0


def _reissued(eraser: Eraser, args: argparse.Namespace, exc: Exception) -> ErasureReceipt | None:
    """An erase of what is erased already (no keys, nothing unfinished): the receipt of
    that erasure again, from its audit record, when the log has one (the run that finished
    it may have died before it printed its receipt); None otherwise."""
    from security.errors import KeyUnavailable

    receipt = eraser.reissue(args.tenant, args.generation) \
        if isinstance(exc, KeyUnavailable) else None
    if receipt is not None:
        print(f"tenant {args.tenant}: already erased (audit record {receipt.audit_seq}); this "
              "is that erasure's receipt, signed again", file=sys.stderr)
    return receipt


def _directory_step(args: argparse.Namespace, keyring: TenantKeyring, eraser: Eraser
                    ) -> Callable[[], int]:
    """The directory step of an erase with ``--redis-url``, checked now and run by the
    erasure (a ``before_keys`` tier) after its ``erasure.begun`` record and before any key
    is destroyed: the namespace is named by the tenant's blinding secret, which the erasure
    shreds, so a directory step that failed after it could never be finished. Failing
    there, it leaves the keys intact and the same command run again completes the erasure.
    An erasure that destroyed the keys and could not record its end is finished with the
    namespaces its marks name."""
    from agentkv_cluster.cli._redis_admin import check_prefix, check_url, erase_namespace
    from agentkv_cluster.runtime.erasure import DIRECTORY_RETRY_S

    check_url(args.redis_url)  # before the erasure's begun record: a typo erases nothing
    check_prefix(args.redis_prefix)
    if args.generation is not None:
        raise CliError("--redis-url deletes whole tenants; the directory retires "
                       "generations itself")
    retry_s = DIRECTORY_RETRY_S if args.retry_s is None else args.retry_s
    if not (math.isfinite(retry_s) and 0 <= retry_s <= MAX_RETRY_S):
        raise CliError(f"--retry-s must be a number of seconds in [0, {MAX_RETRY_S:.0f}]")
    namespaces = eraser.directory_namespaces(args.tenant)  # nothing to erase: SecurityError
    finishing = not keyring.has_keys(args.tenant)
    if not finishing:  # not one to finish: the erasure marks the tenant there
        check_writable_dir(args.keys_dir, "--keys-dir")
    return lambda: sum(erase_namespace(args.redis_url, ns, args.redis_prefix, retry_s=retry_s,
                                       finishing=finishing) for ns in namespaces)


def _check_receipt_out(path: Path | None) -> None:
    """A receipt never replaces a file: one that exists may be an earlier receipt, the
    audit log or a key (one wrong path used to destroy it, exit 0). A device or a pipe
    (``/dev/stdout``, a FIFO) is written in place."""
    if path is not None and path.is_file():
        raise CliError(f"--receipt-out {path} exists; a receipt never replaces a file (an "
                       "earlier receipt, the audit log or a key): name a new file")
    check_writable_file(path, "--receipt-out")


def _write_receipt(path: Path | None, text: str) -> None:
    if path is None:
        return
    try:
        if path.exists() and not path.is_file():  # a device or pipe: written in place
            path.write_text(text)
        else:  # created, never replaced (O_EXCL; a symlink to anything is refused)
            with path.open("x") as out:
                out.write(text)
    except OSError as exc:
        raise CliError(f"keys destroyed, but --receipt-out {path} could not be written "
                       f"({exc.strerror}); the receipt is on stdout above") from None


def _token(args: argparse.Namespace) -> int:
    from agentkv_cluster.cli.serve import read_token_secret
    from security.principals import TokenIssuer

    if not (math.isfinite(args.ttl) and 0 < args.ttl <= MAX_TOKEN_TTL_S):
        raise CliError(f"--ttl must be a number of seconds in (0, {MAX_TOKEN_TTL_S:.0f}]")
    issuer = TokenIssuer(read_token_secret(args.token_secret_file))
    try:
        roles = ["tenant"] + ["admin"] * (args.admin or args.publish) + ["publish"] * args.publish
        token = issuer.issue(args.tenant, subject=args.subject, now=time.time(),
                             ttl_s=args.ttl, roles=roles, public_read=args.public_read)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        emit(token + "\n")
    except OSError as exc:
        raise CliError(f"the token could not be written to standard output ({exc.strerror})"
                       ) from None
    return 0


def _publish(args: argparse.Namespace) -> int:
    from security.errors import SecurityError
    from security.publishing import PublishGrants

    keyring = _keyring(args.keys_dir)
    audit, _ = _audit(args)
    if audit is None:
        raise CliError("publish records the grant: give --audit-log and --signing-key")
    grants = PublishGrants(keyring.source)
    try:
        now = time.time()
        if args.revoke:
            removed = grants.revoke(args.tenant)
            audit.append("publish.revoke", {"tenant": args.tenant, "entries": removed}, now)
            print(f"publish.revoke: tenant {args.tenant} ({removed} grant entries removed)")
        else:
            if not keyring.has_keys(args.tenant):  # a typo would grant a future tenant
                raise CliError(f"tenant {args.tenant!r} has no keys in {args.keys_dir} (never "
                               "created, or erased); create it first: agentkv tenant create "
                               f"{args.tenant} --keys-dir {args.keys_dir}")
            grant = grants.grant(args.tenant, now)
            audit.append("publish.grant", {"tenant": args.tenant, "at": grant.granted_at}, now)
            print(f"publish.grant: tenant {args.tenant} may publish into PUBLIC with a "
                  "token that has the publish role")
    except SecurityError as exc:
        raise CliError(str(exc)) from None
    finally:
        audit.close()
    return 0


def _publishers(args: argparse.Namespace) -> int:
    from security.keyring import FileKeySource
    from security.publishing import PublishGrants

    if not Path(args.keys_dir).is_dir():
        raise CliError(f"key directory {args.keys_dir} does not exist or is not a directory")
    for tenant, grant in PublishGrants(FileKeySource(args.keys_dir, writable=False)).grants().items():
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(grant.granted_at))
        state = "live" if grant.live else "void (the tenant was erased after the grant)"
        print(f"{tenant}\tgranted {when}\t{state}")
    return 0


def _namespace(args: argparse.Namespace) -> int:
    from security.blinding import DirectoryBlinder
    from security.errors import SecurityError
    from security.keyring import FileKeySource, TenantKeyring

    try:
        keyring = TenantKeyring(FileKeySource(args.keys_dir, writable=False))
        print(DirectoryBlinder(keyring).namespace(args.tenant))
    except SecurityError as exc:
        raise CliError(str(exc)) from None
    return 0
