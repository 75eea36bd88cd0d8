"""``agentkv tenant erase``: the erasure, its directory step with ``--redis-url``, and its
receipt (printed first, then written to ``--receipt-out``, which never replaces a file)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agentkv_cluster.cli import CliError, check_writable_dir, check_writable_file, emit
from agentkv_cluster.cli.tenant import _audit, _keyring

if TYPE_CHECKING:
    from security.erasure import Eraser, ErasureReceipt
    from security.keyring import TenantKeyring

MAX_RETRY_S = 86400.0  # tenant erase --retry-s: at most a day of waiting for Redis


def erase(args: argparse.Namespace) -> int:
    """``agentkv tenant erase``: crypto-shred a tenant (or one key generation) with a signed
    receipt, its directory namespace first with ``--redis-url``."""
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
    """The directory step of an erase with ``--redis-url`` (the tenant's namespace, then its
    Redis user), checked now and run by the erasure (a ``before_keys`` tier) after its
    ``erasure.begun`` record and before any key is destroyed: the namespace is named by
    the tenant's blinding secret, which the erasure shreds, so a directory step that
    failed after it could never be finished. Failing
    there, it leaves the keys intact and the same command run again completes the erasure.
    An erasure that destroyed the keys and could not record its end is finished with the
    namespaces its marks name."""
    from agentkv_cluster.cli._redis_admin import (
        check_prefix,
        check_url,
        drop_tenant_user,
        erase_namespace,
    )
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

    def step() -> int:  # the user once Redis answered the namespace's deletion
        removed = sum(erase_namespace(args.redis_url, ns, args.redis_prefix,
                                      retry_s=retry_s, finishing=finishing) for ns in namespaces)
        for ns in namespaces:
            drop_tenant_user(args.redis_url, ns)
        return removed

    return step


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
