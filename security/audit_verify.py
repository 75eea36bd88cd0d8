"""Offline verification of an audit log (``verify_log``): hashes, links, order, time,
checkpoint signatures, the signed head and anchors, with only the public key."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from security.audit_format import (
    CHECKPOINT,
    GENESIS,
    AuditPosition,
    checkpoint_message,
    head_path,
    read_head,
    read_records,
    readable_head,
    record_hash,
    vouches,
)
from security.signing import Verifier, fingerprint


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    ok: bool
    records: int
    checkpoints: int
    head: str
    problems: tuple[str, ...]


def _check_checkpoint(rec: dict, seq: int, prev: str, verifier: Verifier) -> str | None:
    data = rec["data"]
    if not isinstance(data, dict) or data.get("count") != seq or data.get("head") != prev:
        return f"seq {seq}: checkpoint does not match the chain before it"
    try:
        sig = bytes.fromhex(data.get("sig", ""))
    except (TypeError, ValueError):
        sig = b""
    if not verifier.verify(sig, checkpoint_message(seq, prev)):
        mine, theirs = fingerprint(verifier.raw), data.get("key")
        if isinstance(theirs, str) and re.fullmatch(r"[0-9a-f]{16}", theirs) and theirs != mine:
            return (f"seq {seq}: checkpoint signature does not verify: it names key {theirs}, "
                    f"the public key given is {mine} (wrong --public-key, or forged)")
        return f"seq {seq}: checkpoint signature does not verify"
    return None


def _check_head(path: Path, hashes: list[str], verifier: Verifier) -> list[str]:
    hp = head_path(path)
    try:
        count, head_hash, sig = read_head(path)
    except FileNotFoundError:
        return [f"head file {hp} is missing (cannot rule out truncation)"]
    except OSError as exc:
        return [f"head file {hp} cannot be read ({exc.strerror})"]
    except (ValueError, KeyError, TypeError):
        return [f"head file {hp} is malformed"]
    if not verifier.verify(sig, checkpoint_message(count, head_hash)):
        return ["head file signature does not verify"]
    if count > len(hashes):
        return [f"truncated: signed head has {count} records, log has {len(hashes)}"]
    if count < len(hashes):
        if hashes and vouches(readable_head(path, pending=True), len(hashes), hashes[-1],
                              verifier):
            return []  # a writer cut off before it renamed LOG.head.next over the head
        return [f"{len(hashes) - count} records after the signed head are not covered by a signature"]
    if count and hashes[-1] != head_hash or not count and head_hash != GENESIS:
        return ["log end does not match the signed head (rewritten)"]
    return []


def verify_log(path: str | os.PathLike[str], public_key: Verifier, *,
               anchors: Iterable[AuditPosition] = ()) -> VerifyReport:
    """Check hashes, links, order, time, signatures, the signed head and the anchors."""
    path = Path(path)
    problems: list[str] = []
    hashes: list[str] = []
    prev, last_time, checkpoints = GENESIS, float("-inf"), 0
    if not path.exists():
        return VerifyReport(ok=False, records=0, checkpoints=0, head=GENESIS,
                            problems=(f"{path} does not exist",))
    for lineno, rec in read_records(path):
        seq = len(hashes)
        if isinstance(rec, str):
            problems.append(rec)
            break
        if rec["seq"] != seq:
            problems.append(f"line {lineno}: seq {rec['seq']} where {seq} was expected "
                            "(record deleted, inserted or reordered)")
        if rec["prev"] != prev:
            problems.append(f"line {lineno}: link to the previous record is broken")
        if rec["hash"] != record_hash(rec["seq"], rec["time"], rec["kind"], rec["data"], rec["prev"]):
            problems.append(f"line {lineno}: record hash does not match its contents (edited)")
        if rec["time"] < last_time:
            problems.append(f"line {lineno}: time goes backwards")
        if rec["kind"] == CHECKPOINT:
            checkpoints += 1
            bad = _check_checkpoint(rec, seq, prev, public_key)
            if bad:
                problems.append(bad)
        if problems:
            break  # after the first break the rest of the chain proves nothing
        hashes.append(rec["hash"])
        prev, last_time = rec["hash"], rec["time"]
    if not problems:
        problems.extend(_check_head(path, hashes, public_key))
    for anchor in anchors:
        if anchor.seq < 0:
            problems.append(f"anchor seq {anchor.seq} is negative: no record has it")
        elif anchor.seq >= len(hashes):
            problems.append(f"rollback: anchored record seq {anchor.seq} is not in the log")
        elif hashes[anchor.seq] != anchor.hash:
            problems.append(f"anchored record seq {anchor.seq} is another record in this log "
                            "(the log was rewritten, or the anchor comes from another log)")
    return VerifyReport(ok=not problems, records=len(hashes), checkpoints=checkpoints,
                        head=prev, problems=tuple(problems))
