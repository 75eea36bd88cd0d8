"""Tenant-isolation probes against a live deployment (real Redis + sealer + blinding).

``run_probes`` creates two throw-away probe tenants, seeds blinded directory
entries and sealed pages, checks everything the isolation guarantees promise,
then removes what it created. It takes clients rather than importing redis:
``admin`` is an admin connection, ``connect(username, password)`` opens one as
a tenant user.
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from security import redis_acl
from security.blinding import DirectoryBlinder, size_bucket
from security.errors import InvalidSeal
from security.keyring import TenantKeyring
from security.sealing import TenantSealer
from security.signing import canonical_json

_NS_RE = re.compile(rb"akv:\{n[0-9a-f]{24}\}:")
_EPOCH_TEXT_RE = re.compile(rb"(?<![0-9])(1[6-9][0-9]{8}|20[0-9]{8})(?![0-9])")
# Keyed hashes in hex (names, blinded keys) are pseudo-random: blank them before searching,
# so a run of digits inside a hash is not mistaken for a stored length or time.
_HASH_HEX_RE = re.compile(rb"[0-9a-f]{24,}")


class RedisClient(Protocol):
    def execute_command(self, *args: object) -> object: ...


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class ProbeMarkers:
    """Plaintext facts about the seeded pages that must not appear anywhere in Redis."""

    tool_names: tuple[str, ...]
    lengths: tuple[int, ...]
    timestamps: tuple[float, ...]
    tenants: tuple[str, ...]

    def needles(self) -> list[tuple[str, bytes]]:
        out = [("tool name", t.encode()) for t in self.tool_names]
        out += [("tenant name", t.encode()) for t in self.tenants]
        for n in self.lengths:
            out += [("length", str(n).encode()), ("length", struct.pack("<I", n)),
                    ("length", struct.pack(">I", n))]
        for ts in self.timestamps:
            out += [("timestamp", str(int(ts)).encode()), ("timestamp", struct.pack("<d", ts)),
                    ("timestamp", struct.pack(">d", ts))]
        return out


def probe_entry(*, tier: int, codec: int, plaintext_len: int, generation: int, slot: int) -> bytes:
    """The directory value a blinded entry may hold: no length, tool name or time."""
    return canonical_json({"tier": tier, "codec": codec, "bucket": size_bucket(plaintext_len),
                           "gen": generation, "loc": slot})


def read_value(admin: RedisClient, key: bytes) -> bytes:
    """Every byte a key holds, whatever its Redis type."""
    kind = admin.execute_command("TYPE", key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    reads = {"string": [("GET", key)], "hash": [("HGETALL", key)], "list": [("LRANGE", key, 0, -1)],
             "set": [("SMEMBERS", key)], "zset": [("ZRANGE", key, 0, -1, "WITHSCORES")],
             "stream": [("XRANGE", key, "-", "+")]}
    return _flatten([admin.execute_command(*cmd) for cmd in reads.get(kind, [])])


def _flatten(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (str, int, float)):
        return str(value).encode()
    if isinstance(value, dict):
        return b"\0".join(_flatten(k) + b"\0" + _flatten(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return b"\0".join(_flatten(v) for v in value)
    return repr(value).encode()


def scan_all(admin: RedisClient, match: str = "*") -> list[bytes]:
    keys, cursor = [], b"0"
    while True:
        cursor, batch = admin.execute_command("SCAN", cursor, "MATCH", match, "COUNT", 1000)
        keys.extend(batch)
        if cursor in (b"0", 0, "0"):
            return keys


def scan_for_leaks(admin: RedisClient, markers: ProbeMarkers | None = None) -> list[str]:
    """Problems found in every key name and value of the server (empty when clean)."""
    needles = markers.needles() if markers else []
    problems = []
    for key in scan_all(admin):
        if key.startswith(b"akv:") and not _NS_RE.match(key):
            problems.append(f"key namespace is not blinded: {key[:60]!r}")
        blob = _HASH_HEX_RE.sub(b"#", key + b"\0" + read_value(admin, key))
        for what, needle in needles:
            if needle in blob:
                problems.append(f"{what} {needle[:24]!r} found under key {key[:40]!r}")
        if _EPOCH_TEXT_RE.search(blob):
            problems.append(f"a Unix-time-like number is stored under key {key[:40]!r}")
    return problems


def ks_statistic(a: Iterable[float], b: Iterable[float]) -> float:
    """Two-sample Kolmogorov-Smirnov D (no scipy needed at run time)."""
    xs, ys = sorted(a), sorted(b)
    i = j = 0
    d = 0.0
    while i < len(xs) and j < len(ys):
        v = min(xs[i], ys[j])
        while i < len(xs) and xs[i] <= v:
            i += 1
        while j < len(ys) and ys[j] <= v:
            j += 1
        d = max(d, abs(i / len(xs) - j / len(ys)))
    return d


def directory_lookup(client: RedisClient, blinder: DirectoryBlinder, tenant: str,
                     digest: bytes) -> bytes | None:
    """The one code path of a lookup: blind under the caller's own tenant, then one GET."""
    value = client.execute_command("GET", blinder.directory_key(tenant, digest))
    return value if isinstance(value, bytes) else None


Connect = Callable[[str, str], RedisClient]

_DENIED_PROBES: tuple[tuple[str, ...], ...] = (
    ("SCAN", "0"), ("KEYS", "*"), ("DBSIZE",), ("INFO",), ("SLOWLOG", "GET"), ("CLIENT", "LIST"),
    ("MONITOR",), ("CONFIG", "GET", "*"), ("DEBUG", "SLEEP", "0"), ("RANDOMKEY",),
)


def _denied(client: RedisClient, *args: object) -> tuple[bool, str]:
    try:
        client.execute_command(*args)
    except Exception as exc:  # noqa: BLE001 - redis-py's ResponseError family; security does not import redis
        text = str(exc).removeprefix("this user has ")
        ok = "no permissions" in text or "NOPERM" in text or "not allowed" in text
        return ok, text[:72]
    return False, "command was allowed"


@dataclass(slots=True)
class _ProbeTenant:
    name: str
    user: redis_acl.TenantAclUser
    client: RedisClient
    digest: bytes


def _setup(admin: RedisClient, connect: Connect, keyring: TenantKeyring,
           blinder: DirectoryBlinder) -> list[_ProbeTenant]:
    tenants = []
    for label in ("a", "b"):
        name = f"probe-{label}-{os.urandom(4).hex()}"
        keyring.create_tenant(name)
        user = redis_acl.make_user(blinder.namespace(name))
        redis_acl.apply_users(admin, [user])
        tenants.append(_ProbeTenant(name, user, connect(user.username, user.password), os.urandom(32)))
    return tenants


def _acl_probes(a: _ProbeTenant, b: _ProbeTenant, key_a: bytes, key_b: bytes) -> list[ProbeResult]:
    out = []
    own = a.client.execute_command("GET", key_a)
    out.append(ProbeResult(name="acl: own prefix readable (control)", passed=isinstance(own, bytes),
                           detail=f"GET own key -> {len(own or b'')} bytes"))
    for label, args in (("read", ("GET", key_b)), ("write", ("SET", key_b, b"x"))):
        ok, why = _denied(a.client, *args)
        out.append(ProbeResult(name=f"acl: other tenant's key {label} denied", passed=ok, detail=why))
    for args in (*_DENIED_PROBES, ("OBJECT", "ENCODING", key_a)):
        ok, why = _denied(a.client, *args)
        out.append(ProbeResult(name=f"acl: {args[0]} denied", passed=ok, detail=why))
    return out


def _seal_probes(sealer: TenantSealer, a: _ProbeTenant, b: _ProbeTenant) -> list[ProbeResult]:
    page = os.urandom(4096)
    sealed = bytes(sealer.seal(a.name, a.digest, 1, 1, 7, page))
    sealer.keyring.rotate(a.name)  # generation 2 exists: a replay as gen 2 meets a real key
    cases = (("seal: other tenant cannot open", (b.name, a.digest, 1, 1, 7)),
             ("seal: replay under a newer generation rejected", (a.name, a.digest, 2, 1, 7)),
             ("seal: page copied to another slot rejected", (a.name, a.digest, 1, 1, 8)),
             ("seal: page moved to another tier rejected", (a.name, a.digest, 1, 2, 7)),
             ("seal: other identity rejected", (a.name, b.digest, 1, 1, 7)))
    out = []
    for name, args in cases:
        try:
            sealer.open(*args, sealed)
            out.append(ProbeResult(name=name, passed=False, detail="opened"))
        except InvalidSeal:
            out.append(ProbeResult(name=name, passed=True, detail="InvalidSeal"))
    ok = bytes(sealer.open(a.name, a.digest, 1, 1, 7, sealed)) == page
    out.append(ProbeResult(name="seal: own page opens (control)", passed=ok, detail="round trip"))
    return out


def _timing_probe(blinder: DirectoryBlinder, a: _ProbeTenant, b: _ProbeTenant,
                  rounds: int) -> ProbeResult:
    absent = os.urandom(32)
    times: dict[bytes, list[float]] = {a.digest: [], absent: []}
    results = set()
    for _ in range(rounds):
        for digest in (a.digest, absent):
            t0 = time.perf_counter()
            results.add(directory_lookup(b.client, blinder, b.name, digest))
            times[digest].append(time.perf_counter() - t0)
    d = ks_statistic(times[a.digest], times[absent])
    med = [sorted(v)[len(v) // 2] * 1e6 for v in times.values()]
    return ProbeResult(name="timing: cross-tenant existing vs absent prefix", passed=results == {None},
                       detail=f"both miss via one GET; median {med[0]:.0f} vs {med[1]:.0f} us, KS D={d:.3f}")


def run_probes(admin: RedisClient, connect: Connect, keyring: TenantKeyring, *, now: float,
               rounds: int = 200, markers_extra: Iterable[str] = ()) -> list[ProbeResult]:
    """Seed two probe tenants, run every probe, clean up; one result per check."""
    blinder, sealer = DirectoryBlinder(keyring), TenantSealer(keyring)
    tenants = _setup(admin, connect, keyring, blinder)
    a, b = tenants
    key_a, key_b = (blinder.directory_key(t.name, t.digest) for t in tenants)
    length = 54_321
    try:
        a.client.execute_command("SET", key_a, probe_entry(tier=1, codec=0, plaintext_len=length,
                                                           generation=1, slot=7))
        b.client.execute_command("SET", key_b, probe_entry(tier=2, codec=2, plaintext_len=length,
                                                           generation=1, slot=3))
        results = _acl_probes(a, b, key_a, key_b) + _seal_probes(sealer, a, b)
        hit_own = directory_lookup(a.client, blinder, a.name, a.digest) is not None
        miss_other = directory_lookup(b.client, blinder, b.name, a.digest) is None
        results.append(ProbeResult(name="directory: own lookup hits (control)", passed=hit_own,
                                   detail="GET of own blinded key"))
        results.append(ProbeResult(name="directory: cross-tenant lookup misses", passed=miss_other,
                                   detail="B's blinded key for A's identity is unrelated"))
        markers = ProbeMarkers(tool_names=("probe_web_search", *markers_extra), lengths=(length,),
                               timestamps=(now,), tenants=(a.name, b.name))
        leaks = scan_for_leaks(admin, markers)
        results.append(ProbeResult(name="directory: no lengths, tool names or times stored",
                                   passed=not leaks, detail="; ".join(leaks[:3]) or "server scanned clean"))
        results.append(_timing_probe(blinder, a, b, rounds))
        return results
    finally:
        admin.execute_command("DEL", key_a, key_b)
        redis_acl.remove_users(admin, [t.user for t in tenants])
        for t in tenants:
            getattr(t.client, "close", lambda: None)()
            keyring.destroy_tenant(t.name)
