"""Crypto-shredding with signed receipts.

``Eraser.erase_tenant`` / ``erase_generation`` first append an ``erasure.begun`` record
naming the keys they are about to destroy (a log that refuses it stops the erasure with
nothing destroyed), run the tiers that need the keys (``before_keys``), destroy the keys
(so every copy anywhere becomes undecryptable even if a deleter fails), call each other
tier deleter, append the ``erasure`` record and return an Ed25519-signed
``ErasureReceipt`` that anyone can check offline with the public key. An erasure whose
last record the log refused (``ErasureUnrecorded``) is finished by running it again:
``unfinished_erasures`` finds it in the log.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from security.audit import AuditLog, AuditPosition
from security.audit_format import read_records
from security.audit_readback import written_time
from security.blinding import DirectoryBlinder
from security.errors import AuditLogError, ErasureUnrecorded, InvalidReceipt, KeyUnavailable
from security.keyring import (
    PUBLIC_NAMESPACE,
    TenantKeyring,
    validate_generation,
    validate_namespace,
)
from security.publishing import PublishGrants
from security.signing import (
    NonFiniteNumber,
    Signer,
    Verifier,
    canonical_json,
    fingerprint,
    loads_finite,
)

RECEIPT_VERSION = 1
_DOMAIN = b"agentkv-erasure-receipt/v1\0"
_TIER_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_MAX_RECEIPT = 65536
BEGUN, DONE = "erasure.begun", "erasure"  # the audit record kinds of one erasure


@dataclass(frozen=True, kw_only=True)
class EraseScope:
    """What a tier deleter must delete: a whole tenant, or one generation of it."""

    tenant: str
    generation: int | None  # None: every generation


# A deleter removes every page of the scope from its tier and returns how many it removed.
TierDeleter = Callable[[EraseScope], int]


@dataclass(frozen=True, kw_only=True)
class ErasureReceipt:
    version: int = RECEIPT_VERSION
    tenant: str
    scope: str  # "tenant" | "generation"
    generation: int | None
    key_ids: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]  # (tier, pages deleted); -1 where the deleter failed
    failed_tiers: tuple[str, ...] = ()
    time: float
    audit_seq: int
    audit_hash: str
    signer: str = ""  # public-key fingerprint
    signature: str = field(default="", repr=False)

    def body(self) -> dict:
        data = asdict(self)
        data.pop("signature")
        data["key_ids"], data["counts"] = list(self.key_ids), [list(c) for c in self.counts]
        data["failed_tiers"] = list(self.failed_tiers)
        return data

    def signed_message(self) -> bytes:
        return _DOMAIN + canonical_json(self.body())

    def audit_position(self) -> AuditPosition:
        return AuditPosition(seq=self.audit_seq, hash=self.audit_hash)

    def to_json(self) -> str:
        return json.dumps({**self.body(), "signature": self.signature}, sort_keys=True, indent=2)


def sign_receipt(receipt: ErasureReceipt, signer: Signer) -> ErasureReceipt:
    unsigned = ErasureReceipt(**{**_fields(receipt), "signer": fingerprint(signer.public_raw()),
                                 "signature": ""})
    sig = signer.sign(unsigned.signed_message()).hex()
    return ErasureReceipt(**{**_fields(unsigned), "signature": sig})


def _fields(receipt: ErasureReceipt) -> dict:
    return {name: getattr(receipt, name) for name in receipt.__dataclass_fields__}


def _parse(text: str | bytes) -> ErasureReceipt:
    if len(text) > _MAX_RECEIPT:
        raise InvalidReceipt("receipt is larger than 64 KiB")
    try:
        raw = loads_finite(text)
    except NonFiniteNumber as exc:  # no signature covers it: canonical JSON cannot hold it
        raise InvalidReceipt(f"receipt holds a {exc}") from None
    except ValueError:
        raise InvalidReceipt("receipt is not JSON") from None
    expected = set(ErasureReceipt.__dataclass_fields__)
    if not isinstance(raw, dict) or set(raw) != expected:
        raise InvalidReceipt(f"receipt must have exactly the fields {sorted(expected)}")
    try:
        receipt = ErasureReceipt(
            version=_typed(raw["version"], int), tenant=_typed(raw["tenant"], str),
            scope=_typed(raw["scope"], str),
            generation=None if raw["generation"] is None else _typed(raw["generation"], int),
            key_ids=tuple(_typed(k, str) for k in _typed(raw["key_ids"], list)),
            counts=tuple((_typed(c[0], str), _typed(c[1], int))
                         for c in _typed(raw["counts"], list) if _typed(c, list) and len(c) == 2),
            failed_tiers=tuple(_typed(t, str) for t in _typed(raw["failed_tiers"], list)),
            time=float(_typed(raw["time"], (int, float))), audit_seq=_typed(raw["audit_seq"], int),
            audit_hash=_typed(raw["audit_hash"], str), signer=_typed(raw["signer"], str),
            signature=_typed(raw["signature"], str))
    except (TypeError, IndexError) as exc:
        raise InvalidReceipt(f"receipt field has the wrong type: {exc}") from None
    if receipt.version != RECEIPT_VERSION or receipt.scope not in ("tenant", "generation"):
        raise InvalidReceipt("unknown receipt version or scope")
    if len(receipt.counts) != len(raw["counts"]):
        raise InvalidReceipt("receipt counts must be [tier, count] pairs")
    return receipt


def _typed(value: object, kind: type | tuple[type, ...]):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{value!r:.40} is not {kind}")
    return value


def verify_receipt(receipt: str | bytes | ErasureReceipt, public_key: Verifier) -> ErasureReceipt:
    """Parse (if needed) and verify a receipt; raises ``InvalidReceipt``."""
    parsed = receipt if isinstance(receipt, ErasureReceipt) else _parse(receipt)
    if parsed.signer != fingerprint(public_key.raw):
        shown = parsed.signer if re.fullmatch(r"[0-9a-f]{1,64}", parsed.signer) else "(not hex)"
        raise InvalidReceipt(f"receipt was signed by a different key (receipt signer "
                             f"{shown}, public key {fingerprint(public_key.raw)})")
    try:
        sig = bytes.fromhex(parsed.signature)
    except ValueError:
        raise InvalidReceipt("receipt signature is not hex") from None
    if not public_key.verify(sig, parsed.signed_message()):
        raise InvalidReceipt("receipt signature does not verify (receipt altered or forged)")
    return parsed


@dataclass(frozen=True, kw_only=True)
class BegunErasure:
    """An ``erasure.begun`` record of the audit log with no ``erasure`` record after it."""

    tenant: str
    generation: int | None  # None: the whole tenant
    key_ids: tuple[str, ...]  # what it was about to destroy
    seq: int  # the record's place in the log
    time: float


def unfinished_erasures(path: str | os.PathLike[str]) -> list[BegunErasure]:
    """Every erasure the log at ``path`` says began and never recorded its end, in log
    order. Lines that are not records (a torn tail) are skipped: ``verify_log`` judges
    the chain; this only reads what it says."""
    if not Path(path).exists():
        return []
    begun: dict[tuple[str, int | None], BegunErasure] = {}
    for _lineno, rec in read_records(Path(path)):
        if not isinstance(rec, dict) or rec.get("kind") not in (BEGUN, DONE):
            continue
        data = rec["data"]
        if not isinstance(data, dict) or not isinstance(data.get("tenant"), str):
            continue
        gen = data.get("generation")
        scope = (data["tenant"], gen if isinstance(gen, int) else None)
        if rec["kind"] == DONE:  # a whole tenant's erasure ends its generations' too
            for key in [k for k in begun if k == scope or (scope[1] is None and k[0] == scope[0])]:
                del begun[key]
            continue
        ids = data.get("key_ids")
        begun[scope] = BegunErasure(
            tenant=scope[0], generation=scope[1], seq=int(rec["seq"]), time=float(rec["time"]),
            key_ids=tuple(k for k in ids if isinstance(k, str)) if isinstance(ids, list) else ())
    return sorted(begun.values(), key=lambda b: b.seq)


class Eraser:
    """Destroys keys, deletes pages in every registered tier, and signs a receipt."""

    def __init__(self, keyring: TenantKeyring, audit: AuditLog, signer: Signer,
                 unrecorded: dict[int, tuple[tuple[str, int], ...]] | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        """``unrecorded``: what attempts whose end the log refused deleted per tier, by the
        seq of their ``erasure.begun`` record; the attempt that finishes such an erasure
        adds them to its own counts. Share one across Erasers to keep them between calls
        (the service does); a new process does not know them (its receipt counts what it
        deleted itself). ``clock``: the mark's time, read after the ``before_keys`` tiers
        (which may retry for minutes): it voids the tokens issued meanwhile."""
        self.keyring = keyring
        self.audit = audit
        self.signer = signer
        self._clock = clock
        self._tiers: dict[str, TierDeleter] = {}
        self._before_keys: set[str] = set()
        self._unrecorded = {} if unrecorded is None else unrecorded
        self._begun: tuple[tuple[int, int, int], list[BegunErasure]] | None = None

    def register_tier(self, name: str, delete_fn: TierDeleter, *, before_keys: bool = False
                      ) -> None:
        """``before_keys``: a tier that needs the keys (the CLI's directory step: the blinding
        secret names the namespace). It runs after the ``erasure.begun`` record (the log
        says what it destroys before it does) and before any key goes; its exception stops
        the erasure there, unfinished in the log, and the same call run again finishes it
        (resuming one whose keys are gone, it runs first and stops it the same way)."""
        if not _TIER_RE.fullmatch(name) or name in self._tiers:
            raise ValueError(f"invalid or duplicate tier name: {name!r:.40}")
        self._tiers[name] = delete_fn
        if before_keys:
            self._before_keys.add(name)

    def unfinished(self, tenant: str, generation: int | None = None) -> BegunErasure | None:
        """The erasure of this scope that began and recorded no end, if any. The log is
        read in full, so: a tenant never marked erased has no unfinished erasure of its
        own (the mark is written before any key goes, and only an erasure that destroyed
        keys is ever resumed), and its log is not read; the log is read again only once it
        changed (a resume asks twice: for the namespaces, then to finish)."""
        if generation is None and tenant not in self.keyring.erasures():
            return None
        return next((b for b in self._unfinished() if (b.tenant, b.generation) ==
                     (tenant, generation)), None)

    def _unfinished(self) -> list[BegunErasure]:
        try:
            st = os.stat(self.audit.path)
        except FileNotFoundError:
            return []
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._begun is None or self._begun[0] != stamp:
            self._begun = (stamp, unfinished_erasures(self.audit.path))
        return self._begun[1]

    def directory_namespaces(self, tenant: str) -> list[str]:
        """The blinded directory namespaces an erasure of ``tenant`` deletes: its own while
        it has keys (derivable only then); for an erasure that destroyed them and recorded
        no end, the ones its marks name. ``KeyUnavailable`` when there is neither."""
        if self.keyring.has_keys(tenant):
            try:
                return [DirectoryBlinder(self.keyring).namespace(tenant)]
            except KeyUnavailable:  # a blinding secret destroyed part way (a zeroed file)
                if self.unfinished(tenant) is None:  # by an erasure its marks name
                    raise
        elif self.unfinished(tenant) is None:
            raise KeyUnavailable(f"tenant {tenant} has no keys (never created or already erased)")
        return [ns for t, ns in self.keyring.erased_directory_namespaces() if t == tenant]

    def erase_tenant(self, tenant: str, now: float) -> ErasureReceipt:
        validate_namespace(tenant)
        scope = EraseScope(tenant=tenant, generation=None)
        planned = self.keyring.tenant_key_ids(tenant)
        if not planned:  # nothing to erase (leave no mark either), or an erasure to finish
            return self._resume(scope, now, KeyUnavailable(
                f"tenant {tenant} has no keys (never created or already erased)"))
        # An earlier attempt cut off part way destroyed keys this one no longer finds: its
        # receipt names them too (its ``erasure.begun`` did).
        earlier = self.unfinished(tenant)
        planned = list(dict.fromkeys([*(earlier.key_ids if earlier else ()), *planned]))
        # Recorded first: a log that refuses the record stops it here, nothing destroyed.
        begun = self._begin(scope, planned, now)
        early = self._run_before_keys(scope)
        now = now if self._clock is None else max(now, self._clock())
        # Marked next: a token issued before now must not provision the tenant again
        # while (or after) its keys are destroyed. The mark keeps the blinded directory
        # namespace, which nothing can derive once the blinding secret is gone.
        try:
            directory_ns: str | None = DirectoryBlinder(self.keyring).namespace(tenant)
        except KeyUnavailable:  # generations without a blinding secret: never published
            directory_ns = None
        self.keyring.mark_erased(tenant, now, directory_ns)
        key_ids = list(dict.fromkeys([*planned, *self.keyring.destroy_tenant(tenant)]))
        if tenant != PUBLIC_NAMESPACE:  # its grant to publish goes too (one older than
            PublishGrants(self.keyring.source).revoke(tenant)  # the mark is void anyway)
        return self._finish(scope, key_ids, now, begun, early)

    def erase_generation(self, tenant: str, generation: int, now: float) -> ErasureReceipt:
        validate_namespace(tenant)
        validate_generation(generation)
        scope = EraseScope(tenant=tenant, generation=generation)
        try:
            planned = [self.keyring.key_id(tenant, generation)]
        except KeyUnavailable as exc:
            return self._resume(scope, now, exc)
        begun = self._begin(scope, planned, now)
        early = self._run_before_keys(scope)
        key_ids = self.keyring.destroy_generation(tenant, generation)
        return self._finish(scope, key_ids, now, begun, early)

    def _begin(self, scope: EraseScope, key_ids: list[str], now: float) -> int:
        # Keys it cannot destroy (a read-only key directory): refused before any record.
        self.keyring.source.require_writable()
        return self.audit.append(BEGUN, {
            "tenant": scope.tenant, "generation": scope.generation,
            "scope": "tenant" if scope.generation is None else "generation",
            "key_ids": key_ids}, now).seq

    def _run_before_keys(self, scope: EraseScope) -> dict[str, int]:
        """Each ``before_keys`` tier's count; its exception is the caller's (see there)."""
        return {name: int(fn(scope)) for name, fn in self._tiers.items() if name in self._before_keys}

    def _resume(self, scope: EraseScope, now: float, missing: KeyUnavailable) -> ErasureReceipt:
        """Finish the erasure of ``scope`` that began and recorded no end (its keys are
        gone, maybe its pages too: the deleters run again); ``missing`` if there is none."""
        begun = self.unfinished(scope.tenant, scope.generation)
        if begun is None:
            raise missing
        early = self._run_before_keys(scope)
        self.keyring.finish_destroy(scope.tenant, scope.generation)  # zeroed, not unlinked
        if scope.generation is not None:  # cut off between its key and its marker
            self.keyring.mark_generation_erased(scope.tenant, scope.generation)
        elif scope.tenant != PUBLIC_NAMESPACE:  # cut off before its grant went (void, yet
            PublishGrants(self.keyring.source).revoke(scope.tenant)  # listed as a grant)
        return self._finish(scope, list(begun.key_ids), now, begun.seq, early)

    def reissue(self, tenant: str, generation: int | None = None) -> ErasureReceipt | None:
        """The receipt of the last recorded erasure of this scope, signed again from its
        ``erasure`` record, which holds all of it (the process that finished it may have
        died before it printed the receipt): the same bytes, the signature being
        deterministic. None when the log records no such erasure."""
        last = None
        for _n, rec in read_records(self.audit.path) if self.audit.path.exists() else ():
            data = rec.get("data") if isinstance(rec, dict) and rec.get("kind") == DONE else None
            if isinstance(data, dict) and (data.get("tenant"), data.get("generation")) == \
                    (tenant, generation):
                last = rec
        if last is None:
            return None
        data = last["data"]
        return sign_receipt(ErasureReceipt(
            tenant=tenant, scope=data["scope"], generation=generation,
            key_ids=tuple(data["key_ids"]), counts=tuple((n, c) for n, c in data["counts"]),
            failed_tiers=tuple(data["failed_tiers"]), time=float(last["time"]),
            audit_seq=int(last["seq"]), audit_hash=str(last["hash"])), self.signer)

    def _finish(self, scope: EraseScope, key_ids: list[str], now: float, begun: int,
                early: Mapping[str, int]) -> ErasureReceipt:
        counts: list[tuple[str, int]] = []
        failed: list[str] = []
        for name, delete_fn in self._tiers.items():
            if name in early:  # ran before the keys went
                counts.append((name, early[name]))
                continue
            try:
                counts.append((name, int(delete_fn(scope))))
            except Exception:  # noqa: BLE001 - any deleter failure must still yield a receipt
                # The keys are gone already, so pages left behind stay unreadable.
                counts.append((name, -1))
                failed.append(name)
        counts = _with_earlier(counts, self._unrecorded.get(begun, ()))
        kind = "tenant" if scope.generation is None else "generation"
        try:
            pos = self.audit.append(DONE, {
                "tenant": scope.tenant, "scope": kind, "generation": scope.generation,
                "key_ids": key_ids, "counts": [list(c) for c in counts],
                "failed_tiers": failed, "begun": begun,
            }, now)
        except (AuditLogError, OSError) as exc:
            self._unrecorded[begun] = tuple(counts)
            raise ErasureUnrecorded(
                f"the keys of {kind} {scope.tenant} are destroyed and its pages deleted, but "
                f"the audit log refused the erasure's record ({type(exc).__name__}: {exc}); "
                "no receipt was signed: run the same erasure again once the log takes "
                "writes, it finishes this one") from exc
        self._unrecorded.pop(begun, None)
        # The time the record holds: the log moves it up past a later one another writer
        # appended meanwhile, and ``reissue`` signs the record's time (the same bytes).
        receipt = ErasureReceipt(
            tenant=scope.tenant, scope=kind, generation=scope.generation, key_ids=tuple(key_ids),
            counts=tuple(counts), failed_tiers=tuple(failed),
            time=written_time(self.audit.path, pos, float(now)),
            audit_seq=pos.seq, audit_hash=pos.hash)
        return sign_receipt(receipt, self.signer)


def _with_earlier(counts: list[tuple[str, int]], earlier: Sequence[tuple[str, int]]
                  ) -> list[tuple[str, int]]:
    """Each tier's count plus what earlier, unrecorded attempts of the same erasure deleted
    there. A tier that fails now counts -1 (failed); one that failed before and not now
    counts what it deleted now (its deleter ran again in full)."""
    before = dict(earlier)
    return [(name, n if n < 0 or before.get(name, 0) < 0 else n + before.get(name, 0))
            for name, n in counts]
