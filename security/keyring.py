"""Tenant keys: a KEK per (tenant, generation) from a pluggable ``KeySource``.

Data keys are derived with HKDF from the KEK and a random 64-bit epoch chosen
by the sealing process; each data key is retired before it reaches the NIST
SP 800-38D limit of 2**32 random-nonce encryptions. Key material never appears
in a log line, exception message or directory entry.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from security import _primitives as prim
from security.errors import InvalidName, KeyExists, KeyUnavailable
from security.key_sources import (  # where keys live (re-exported here)
    BlobStore,
    FileKeySource,
    KeyDestroyed,
    KeySource,
    KeyWrapper,
    LocalKeyWrapper,
    WrappedKeySource,
)

PUBLIC_NAMESPACE = "_public"
_TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_KEK_RE = re.compile(r"(?P<ns>[a-z0-9_][a-z0-9_-]*)\.g(?P<gen>\d{8})\.(?P<kind>kek|gone)")
_ERASED_RE = re.compile(r"(?P<ns>[a-z0-9_][a-z0-9_-]*)\.erased\.(?P<ms>\d{13})")
_ERASED_DIR_RE = re.compile(r"(?P<ns>[a-z0-9_][a-z0-9_-]*)\.dirns\.(?P<dir>n[0-9a-f]{24})")
MAX_GENERATION = 99_999_999
NIST_RANDOM_NONCE_LIMIT = 2**32  # SP 800-38D §8.3: invocations per key with random IVs


def validate_namespace(namespace: object) -> str:
    """A tenant name (``[a-z0-9][a-z0-9_-]{0,62}``) or the PUBLIC namespace."""
    if not isinstance(namespace, str) or not (
        namespace == PUBLIC_NAMESPACE or _TENANT_RE.fullmatch(namespace)
    ):
        raise InvalidName(f"invalid tenant or namespace name: {namespace!r:.80}")
    return namespace


def validate_generation(generation: object) -> int:
    if type(generation) is not int or not 1 <= generation <= MAX_GENERATION:
        raise InvalidName(f"generation must be an int in 1..{MAX_GENERATION}: {generation!r:.40}")
    return generation


def kek_name(namespace: str, generation: int) -> str:
    return f"{namespace}.g{generation:08d}.kek"


def tombstone_name(namespace: str, generation: int) -> str:
    """Left behind by ``destroy_generation`` so a generation number is never reused."""
    return f"{namespace}.g{generation:08d}.gone"


def blind_name(namespace: str) -> str:
    return f"{namespace}.blind.key"


def erased_name(namespace: str, at: float) -> str:
    """Left behind by ``mark_erased``: the erasure time (ms) outlives the keys, so tokens
    issued before it can be refused even after the tenant is provisioned again. Rounded
    up, never down: a token issued a fraction of a millisecond before the erasure is
    older than the mark (a token issued in that same millisecond after it is refused
    too; the client asks for a new one)."""
    return f"{namespace}.erased.{math.ceil(at * 1000):013d}"


@dataclass(frozen=True, kw_only=True)
class KeyringConfig:
    nonce_limit: int = NIST_RANDOM_NONCE_LIMIT  # seals per data key before a fresh epoch
    open_cache_size: int = 1024  # derived data keys kept for opening


@dataclass(slots=True)
class _SealKey:
    epoch: int
    aead: prim.Aead
    used: int


def _derive(kek: bytes, namespace: str, generation: int, epoch: int) -> prim.Aead:
    info = b"agentkv/dek/v1\0" + namespace.encode() + b"\0"
    info += generation.to_bytes(8, "big") + epoch.to_bytes(8, "big")
    return prim.Aead(prim.hkdf_sha256(kek, info))


class TenantKeyring:
    """KEKs per (namespace, generation), derived data keys, nonce budgets, blinding secrets."""

    def __init__(self, source: KeySource, config: KeyringConfig = KeyringConfig()) -> None:
        if not 1 <= config.nonce_limit <= NIST_RANDOM_NONCE_LIMIT:
            raise ValueError("nonce_limit must be in 1..2**32 (NIST SP 800-38D)")
        self.source = source
        self.config = config
        self._lock = threading.Lock()
        self._keks: dict[tuple[str, int], bytes] = {}
        self._seal: dict[tuple[str, int], _SealKey] = {}
        self._open: OrderedDict[tuple[str, int, int], prim.Aead] = OrderedDict()
        self.retired_epochs = 0  # data keys retired by the nonce budget, for metrics

    # -- lifecycle -------------------------------------------------------------
    def create_tenant(self, namespace: str) -> int:
        """Create the blinding secret and a first generation; returns it (1, unless
        generations of the name were erased one by one: the next above them)."""
        validate_namespace(namespace)
        if self.generations(namespace):
            raise KeyExists(f"tenant {namespace} already has keys")
        # A blinding secret without a generation is an earlier creation cut short (a full
        # disk, a crash between the two files), or what generation erasures left: kept.
        with contextlib.suppress(KeyExists):
            self.source.create(blind_name(namespace), prim.random_bytes(prim.KEY_BYTES))
        return self._add_generation(namespace)

    def rotate(self, namespace: str) -> int:
        """Add a generation above every live or erased one; older ones stay readable."""
        if not self.generations(namespace):  # the tenant must exist
            raise KeyUnavailable(f"tenant {namespace} has no keys (never created or already "
                                 "erased): only a tenant with a key generation rotates")
        return self._add_generation(namespace)

    def _add_generation(self, namespace: str) -> int:
        """A new KEK one above every live or erased generation (1 for none); its number."""
        generation = max(self._generations(namespace, ("kek", "gone")), default=0) + 1
        self.source.create(kek_name(namespace, validate_generation(generation)),
                           prim.random_bytes(prim.KEY_BYTES))
        return generation

    def generations(self, namespace: str) -> list[int]:
        """Live (not erased) generations, oldest first."""
        return self._generations(namespace, ("kek",))

    def _generations(self, namespace: str, kinds: tuple[str, ...]) -> list[int]:
        validate_namespace(namespace)
        found = (_KEK_RE.fullmatch(n) for n in self.source.names())
        return sorted(int(m["gen"]) for m in found
                      if m and m["ns"] == namespace and m["kind"] in kinds)

    def current_generation(self, namespace: str) -> int:
        gens = self.generations(namespace)
        if not gens:
            raise KeyUnavailable(f"tenant {namespace} has no keys")
        return gens[-1]

    def key_id(self, namespace: str, generation: int) -> str:
        """A public name for a KEK: namespace, generation and a keyed fingerprint."""
        kek = self._kek(namespace, generation)
        return f"{namespace}/g{generation}/{prim.hkdf_sha256(kek, b'agentkv/key-id/v1', 8).hex()}"

    def blind_secret(self, namespace: str) -> bytes:
        """KeyUnavailable naming the tenant when it has no keys at all (never created, or
        erased); the source's own error when only this key is missing."""
        try:
            return self.source.read(blind_name(validate_namespace(namespace)))
        except KeyUnavailable:
            if not self.has_keys(namespace):
                raise KeyUnavailable(f"tenant {namespace} has no keys (never created or "
                                     "already erased)") from None
            raise

    # -- data keys -------------------------------------------------------------
    def seal_key(self, namespace: str, generation: int, uses: int = 1) -> tuple[int, prim.Aead]:
        """The (epoch, data key) for ``uses`` more seals (a chunked record takes one per
        chunk, all under one epoch); counts them against the nonce budget."""
        if not 1 <= uses <= self.config.nonce_limit:
            raise ValueError(f"uses must be in 1..{self.config.nonce_limit}")
        slot = (namespace, generation)
        with self._lock:
            current = self._seal.get(slot)
            if current is None or current.used + uses > self.config.nonce_limit:
                if current is not None:
                    self.retired_epochs += 1
                kek = self._kek_locked(namespace, generation)
                epoch = int.from_bytes(prim.random_bytes(8), "big") or 1
                current = _SealKey(epoch, _derive(kek, namespace, generation, epoch), 0)
                self._seal[slot] = current
            current.used += uses
            return current.epoch, current.aead

    def open_key(self, namespace: str, generation: int, epoch: int) -> prim.Aead:
        """The data key of an epoch (raises KeyUnavailable once erased)."""
        slot = (namespace, generation, epoch)
        with self._lock:
            aead = self._open.get(slot)
            if aead is not None:
                self._open.move_to_end(slot)
                return aead
            aead = _derive(self._kek_locked(namespace, generation), namespace, generation, epoch)
            self._open[slot] = aead
            if len(self._open) > self.config.open_cache_size:
                self._open.popitem(last=False)
            return aead

    def nonce_uses(self, namespace: str, generation: int) -> int:
        """Seals made with the current data key of (namespace, generation)."""
        current = self._seal.get((namespace, generation))
        return 0 if current is None else current.used

    # -- erasure ---------------------------------------------------------------
    def destroy_generation(self, namespace: str, generation: int) -> list[str]:
        """Crypto-shred one generation; returns the destroyed key ids."""
        key_id = self.key_id(namespace, generation)
        self.source.destroy(kek_name(namespace, generation))
        self.mark_generation_erased(namespace, generation)
        self._forget(namespace, {generation})
        return [key_id]

    def mark_generation_erased(self, namespace: str, generation: int) -> None:
        """The generation's ``.gone`` marker (running services enforce the erasure by it);
        kept if there is one (an erasure finished again after it was cut off)."""
        with contextlib.suppress(KeyExists):
            self.source.create(tombstone_name(namespace, generation), b"")

    def mark_erased(self, namespace: str, at: float, directory_namespace: str | None = None
                    ) -> None:
        """Record that ``namespace`` was erased at ``at`` (kept when its keys are gone),
        and its blinded directory namespace if given: derived from the blinding secret the
        erasure destroys, it is how a directory that comes back from an older snapshot is
        erased again (``erased_directory_namespaces``)."""
        validate_namespace(namespace)
        if directory_namespace is not None:
            name = f"{namespace}.dirns.{directory_namespace}"
            if not _ERASED_DIR_RE.fullmatch(name):
                raise InvalidName(f"invalid directory namespace: {directory_namespace!r:.40}")
            with contextlib.suppress(KeyExists):  # erased again under the same secret
                self.source.create(name, b"")
        with contextlib.suppress(KeyExists):  # the same millisecond: already recorded
            self.source.create(erased_name(namespace, at), b"")

    def erased_directory_namespaces(self) -> list[tuple[str, str]]:
        """(tenant, blinded directory namespace) of every tenant erasure that recorded one."""
        found = (_ERASED_DIR_RE.fullmatch(n) for n in self.source.names())
        return sorted((m["ns"], m["dir"]) for m in found if m)

    def erased_at(self, namespace: str) -> float | None:
        """When ``namespace`` was last erased (seconds), or None if it never was."""
        return self.erasures().get(validate_namespace(namespace))

    def erased_generations(self) -> list[tuple[str, int]]:
        """(namespace, generation) of every erased generation (its ``.gone`` marker, until
        a whole-tenant erasure removes it)."""
        found = (_KEK_RE.fullmatch(n) for n in self.source.names())
        return sorted((m["ns"], int(m["gen"])) for m in found if m and m["kind"] == "gone")

    def erasures(self) -> dict[str, float]:
        """Every erased namespace, with when it was last erased (seconds)."""
        out: dict[str, float] = {}
        for m in (_ERASED_RE.fullmatch(n) for n in self.source.names()):
            if m:
                out[m["ns"]] = max(out.get(m["ns"], 0.0), int(m["ms"]) / 1000)
        return out

    def tenant_key_ids(self, namespace: str) -> list[str]:
        """The ids of every key ``destroy_tenant`` would destroy now (none: no keys)."""
        ids = self._live_key_ids(namespace, self.generations(namespace))
        if blind_name(namespace) in set(self.source.names()):
            ids.append(f"{namespace}/blind")
        return ids

    def destroy_tenant(self, namespace: str) -> list[str]:
        """Crypto-shred every generation and the blinding secret of a namespace."""
        gens = self.generations(namespace)
        ids = self._live_key_ids(namespace, gens)
        for generation in gens:  # a zeroed one too: its file goes
            self.source.destroy(kek_name(namespace, generation))
        if self.source.destroy(blind_name(namespace)):
            ids.append(f"{namespace}/blind")
        for generation in self._generations(namespace, ("gone",)):  # nothing of the tenant stays
            self.source.destroy(tombstone_name(namespace, generation))
        self._forget(namespace, set(gens))
        if not ids:
            raise KeyUnavailable(f"tenant {namespace} has no keys (never created or already erased)")
        return ids

    def _live_key_ids(self, namespace: str, generations: list[int]) -> list[str]:
        """The key ids of ``generations``, less those a destroy cut off zeroed: no key (an
        id derived from zeros names none; the erasure that zeroed it recorded the real one)."""
        ids = []
        for generation in generations:
            with contextlib.suppress(KeyDestroyed):
                ids.append(self.key_id(namespace, generation))
        return ids

    def finish_destroy(self, namespace: str, generation: int | None = None) -> None:
        """Remove what destroys cut off after zeroing left of ``namespace``'s keys (one
        generation's KEK, or every key of it); keys that still read as keys stay."""
        gens = self.generations(namespace) if generation is None else [generation]
        names = [kek_name(namespace, g) for g in gens]
        for name in names + ([blind_name(namespace)] if generation is None else []):
            try:
                self.source.read(name)
            except KeyDestroyed:
                self.source.destroy(name)
            except KeyUnavailable:  # gone already, or not ours to judge
                continue

    def tenants(self) -> list[str]:
        """Every tenant that holds a blinding secret (PUBLIC excluded), sorted."""
        suffix = ".blind.key"
        found = (n[: -len(suffix)] for n in self.source.names() if n.endswith(suffix))
        return sorted(t for t in found if t != PUBLIC_NAMESPACE and _TENANT_RE.fullmatch(t))

    def has_keys(self, namespace: str) -> bool:
        """Whether ``namespace`` holds any key material (a live generation or its blinding
        secret): an erasure of a tenant without any leaves no mark."""
        validate_namespace(namespace)
        names = set(self.source.names())
        return bool(self.generations(namespace)) or blind_name(namespace) in names

    def forget(self, namespace: str) -> None:
        """Drop every cached key of ``namespace`` (KEKs, sealing and opening data keys).
        A process that did not destroy the keys itself calls this when it learns of an
        erasure; a tenant provisioned again under the same name then reads its new keys."""
        with self._lock:
            for cache in (self._keks, self._seal, self._open):
                for slot in [s for s in cache if s[0] == namespace]:
                    del cache[slot]

    def forget_generation(self, namespace: str, generation: int) -> None:
        """Drop the cached keys of one generation: a process that did not destroy it calls
        this when it learns of its erasure (``erased_generations``)."""
        self._forget(validate_namespace(namespace), {generation})

    def _forget(self, namespace: str, generations: set[int]) -> None:
        with self._lock:
            for cache in (self._keks, self._seal):
                for slot in [s for s in cache if s[0] == namespace and s[1] in generations]:
                    del cache[slot]
            for slot in [s for s in self._open if s[0] == namespace and s[1] in generations]:
                del self._open[slot]

    def _kek(self, namespace: str, generation: int) -> bytes:
        with self._lock:
            return self._kek_locked(namespace, generation)

    def _kek_locked(self, namespace: str, generation: int) -> bytes:
        slot = (validate_namespace(namespace), validate_generation(generation))
        kek = self._keks.get(slot)
        if kek is None:
            kek = self.source.read(kek_name(namespace, generation))
            self._keks[slot] = kek
        return kek


__all__ = [
    "MAX_GENERATION", "NIST_RANDOM_NONCE_LIMIT", "PUBLIC_NAMESPACE", "BlobStore",
    "FileKeySource", "KeyDestroyed", "KeySource", "KeyWrapper", "KeyringConfig", "LocalKeyWrapper",
    "TenantKeyring", "WrappedKeySource", "blind_name", "erased_name", "kek_name",
    "tombstone_name", "validate_generation", "validate_namespace",
]
