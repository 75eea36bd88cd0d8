"""``agentkv tenant``: create, rotate and erase tenant keys (crypto-shredding with a receipt),
grant or revoke publishing into PUBLIC, issue client tokens and print a tenant's blinded
directory namespace."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from pathlib import Path

from agentkv_cluster.cli import (
    CliError,
    add_state_dir,
    check_writable_dir,
    emit,
)

MAX_TOKEN_TTL_S = 366 * 86400.0  # a token lives at most a year (rotate the secret to revoke)


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
    from agentkv_cluster.cli._tenant_erase import erase

    return erase(args)


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
