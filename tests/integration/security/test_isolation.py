"""Acceptance 3, 4, 5 and 8 against a real redis-server, real /dev/shm and real files."""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import struct
import sys
import time
from pathlib import Path

import pytest
import redis
from scipy import stats

from agentkv_cluster.lifecycle.identity import PageIdentity
from security.errors import InvalidSeal
from security.isolation import ProbeMarkers, read_value, scan_all, scan_for_leaks
from store.types import Lookup, Tier
from tests.integration.security.conftest import NOW

pytestmark = pytest.mark.integration

BASE = PageIdentity(model_version="smollm2-135m@q4_1", adapter_version="", tokenizer_version="tok-v3",
                    rope_config="theta=1e4;scale=1", tenant="acme", session="s-1", start=0, end=512,
                    event_version=7)
TOOLS = ("web_search", "sql_query", "python_exec")
LENGTHS = (12_345, 23_456, 31_337)


def _page(n: int) -> bytes:
    return os.urandom(n)


def test_cross_tenant_prefix_reuse_never_hits(cache, tokens):
    """Acceptance 3: B never hits A's pages in any tier; A hits its own (control)."""
    for tier in Tier:
        ident = dataclasses.replace(BASE, session=f"s-{tier.name}")
        page = _page(4096)
        cache.put(tokens["acme"], ident.digest(), tier, page, NOW)
        assert cache.lookup(tokens["acme"], ident.digest(), NOW) == (Lookup.HIT, page)
        # B asks for the very same identity (tenant field says "acme"): the tenant comes from B's token.
        assert cache.lookup(tokens["globex"], ident.digest(), NOW) == (Lookup.MISS, None)
        b_ident = dataclasses.replace(ident, tenant="globex")
        assert cache.lookup(tokens["globex"], b_ident.digest(), NOW) == (Lookup.MISS, None)


def test_copied_page_and_forged_entry_in_every_tier_do_not_hit(cache, tokens):
    """B's storage-level attacker copies A's sealed page into B's slot and points B's entry at it."""
    for tier in Tier:
        ident = dataclasses.replace(BASE, session=f"copy-{tier.name}")
        a_slot = cache.put(tokens["acme"], ident.digest(), tier, _page(2048), NOW)
        b_slot = cache.put(tokens["globex"], ident.digest(), tier, _page(2048), NOW)
        cache.tiers.write(tier, b_slot, cache.tiers.read(tier, a_slot))
        assert cache.lookup(tokens["globex"], ident.digest(), NOW) == (Lookup.MISS, None)
        cache.tiers.write(tier, a_slot + 40, cache.tiers.read(tier, a_slot))  # moved slot
        entry_key = cache.blinder.directory_key("acme", ident.digest())
        value = cache.clients["acme"].get(entry_key).replace(b'"loc":%d' % a_slot, b'"loc":%d' % (a_slot + 40))
        cache.clients["acme"].set(entry_key, value)
        assert cache.lookup(tokens["acme"], ident.digest(), NOW) == (Lookup.MISS, None)


FIELD_CHANGES = {
    "model_version": "smollm2-360m@q4_1", "adapter_version": "lora-7", "tokenizer_version": "tok-v4",
    "rope_config": "theta=1e6;scale=1", "tenant": "globex", "session": "s-2", "start": 1, "end": 511,
    "event_version": 8,
}


@pytest.mark.parametrize("tier", list(Tier), ids=lambda t: t.name)
def test_changing_any_identity_field_gives_no_hit(cache, tokens, tier):
    """Acceptance 4: each single-field change of the identity misses, in every tier."""
    assert set(FIELD_CHANGES) == {f.name for f in dataclasses.fields(PageIdentity)}
    page = _page(1024)
    cache.put(tokens["acme"], BASE.digest(), tier, page, NOW)
    assert cache.lookup(tokens["acme"], BASE.digest(), NOW) == (Lookup.HIT, page)
    for name, value in FIELD_CHANGES.items():
        changed = dataclasses.replace(BASE, **{name: value})
        assert changed.mismatches(BASE) == (name,)
        assert cache.lookup(tokens["acme"], changed.digest(), NOW) == (Lookup.MISS, None), name


def _denied(client, *args) -> bool:
    try:
        client.execute_command(*args)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def _seed_many(cache, tokens) -> ProbeMarkers:
    for i, (tool, length) in enumerate(zip(TOOLS * 3, LENGTHS * 3)):
        for tenant in ("acme", "globex"):
            # The tool name and time travel with the request; none of it may reach Redis.
            ident = dataclasses.replace(BASE, session=f"{tenant}-{tool}-{i}", end=512 + length)
            cache.put(tokens[tenant], ident.digest(), Tier(i % 3), _page(length), NOW + i)
    return ProbeMarkers(tool_names=TOOLS, lengths=LENGTHS, timestamps=(NOW, NOW + 1),
                        tenants=("acme", "globex"))


def test_redis_acl_and_stored_contents(cache, tokens, acl_redis):
    """Acceptance 5: B's user cannot list, count, scan or read A's keys, slow log or clients;
    nothing stored holds plaintext lengths, tool names or timestamps."""
    markers = _seed_many(cache, tokens)
    admin, b = cache.admin, cache.clients["globex"]
    a_keys = scan_all(admin, f"akv:{{{cache.blinder.namespace('acme')}}}:*")
    assert len(a_keys) == 9  # control: A's entries exist
    assert admin.slowlog_len() > 0 and admin.client_list()  # control: there is something to hide
    for key in a_keys[:3]:
        assert _denied(b, "GET", key) and _denied(b, "SET", key, b"x") and _denied(b, "DEL", key)
        assert _denied(b, "EXISTS", key) and _denied(b, "EVAL", "return redis.call('GET', KEYS[1])", 1, key)
    for args in (("SCAN", 0), ("SCAN", 0, "MATCH", "akv:*"), ("KEYS", "*"), ("DBSIZE",), ("INFO",),
                 ("INFO", "keyspace"), ("SLOWLOG", "GET"), ("SLOWLOG", "LEN"), ("CLIENT", "LIST"),
                 ("CLIENT", "INFO"), ("MONITOR",), ("CONFIG", "GET", "*"), ("DEBUG", "SLEEP", "0"),
                 ("OBJECT", "ENCODING", a_keys[0]), ("RANDOMKEY",), ("MEMORY", "USAGE", a_keys[0])):
        assert _denied(b, *args), args
    own = scan_all(admin, f"akv:{{{cache.blinder.namespace('globex')}}}:*")
    assert b.get(own[0]) is not None  # control: B reads its own entries
    # Scan the real server: every key name and value, and the slow log (it records arguments).
    problems = scan_for_leaks(admin, markers)
    assert problems == []
    slowlog = b"\0".join(b" ".join(map(bytes, e["command"] if isinstance(e["command"], list)
                                       else [e["command"]])) for e in admin.slowlog_get(100_000))
    slowlog = re.sub(rb"[0-9a-f]{24,}", b"#", slowlog)  # blank keyed hashes (blinded key names)
    for what, needle in markers.needles():
        assert needle not in slowlog, what
    for key in scan_all(admin):
        value = read_value(admin, key)
        assert b"acme" not in key + value and b"globex" not in key + value
        assert struct.pack("<d", NOW) not in value


def test_leak_scan_catches_a_leaky_writer(cache, tokens):
    """Control for the scan itself: an entry that stores a length, a tool name and a time is found."""
    _seed_many(cache, tokens)
    ns = cache.blinder.namespace("acme")
    cache.admin.set(f"akv:{{{ns}}}:e:leaky", f'{{"len":{LENGTHS[0]},"tool":"web_search","t":{int(NOW)}}}')
    markers = ProbeMarkers(tool_names=TOOLS, lengths=LENGTHS, timestamps=(NOW,), tenants=("acme",))
    problems = scan_for_leaks(cache.admin, markers)
    assert any("tool name" in p for p in problems) and any("length" in p for p in problems)
    assert any("timestamp" in p for p in problems)


def _trace_lines(fn, *args):
    """Every line this repository's code runs (security + harness); the Redis side is
    compared through the server's command counters. GC is paused so that no finalizer
    of unrelated objects lands in one trace and not the other."""
    lines = []
    root = Path(__file__).resolve().parents[3]
    mine = (str(root / "security"), str(root / "tests"))

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if event in ("call", "line", "return") and name.startswith(mine):
            lines.append((name, frame.f_code.co_name, frame.f_lineno, event))
        return tracer

    gc.disable()
    sys.settrace(tracer)
    try:
        result = fn(*args)
    finally:
        sys.settrace(None)
        gc.enable()
    return result, lines


def _commandstats(admin) -> dict[str, int]:
    return {k: v["calls"] for k, v in admin.info("commandstats").items()}


def test_cross_tenant_lookup_timing_is_the_absent_prefix_path(cache, tokens):
    """Acceptance 8: B's lookup of A's existing prefix and of an absent prefix run the same code
    (traced line by line, same Redis commands) and their latency distributions are reported."""
    existing = BASE.digest()
    absent = dataclasses.replace(BASE, session="never-stored").digest()
    cache.put(tokens["acme"], existing, Tier.HOST, _page(4096), NOW)
    b_token = tokens["globex"]
    for _ in range(50):  # warm caches (secrets, connections) equally
        cache.lookup(b_token, existing, NOW), cache.lookup(b_token, absent, NOW)
    r1, path_existing = _trace_lines(cache.lookup, b_token, existing, NOW)
    r2, path_absent = _trace_lines(cache.lookup, b_token, absent, NOW)
    assert r1 == r2 == (Lookup.MISS, None)
    assert len(path_existing) > 30 and path_existing == path_absent
    _, path_hit = _trace_lines(cache.lookup, tokens["acme"], existing, NOW)
    assert path_hit != path_absent  # control: the tracer does tell a hit from a miss
    before = _commandstats(cache.admin)
    times = {"existing": [], "absent": []}
    for _ in range(2000):
        for label, digest in (("existing", existing), ("absent", absent)):
            t0 = time.perf_counter_ns()
            cache.lookup(b_token, digest, NOW)
            times[label].append((time.perf_counter_ns() - t0) / 1000)
    after = _commandstats(cache.admin)
    calls = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert calls.get("cmdstat_get") == 4000  # one GET per lookup, nothing else differs by input
    ks = stats.ks_2samp(times["existing"], times["absent"])
    mw = stats.mannwhitneyu(times["existing"], times["absent"])
    q = lambda xs: " ".join(f"p{p}={sorted(xs)[int(len(xs) * p / 100) - (p == 100)]:.1f}"
                            for p in (5, 25, 50, 75, 95, 99))
    print(f"\ncross-tenant lookup of an EXISTING prefix (us): {q(times['existing'])}")
    print(f"cross-tenant lookup of an ABSENT prefix   (us): {q(times['absent'])}")
    print(f"KS D={ks.statistic:.4f} p={ks.pvalue:.3g}; Mann-Whitney U={mw.statistic:.0f} p={mw.pvalue:.3g}")


def test_public_namespace_is_the_only_shared_path(cache, tokens):
    """A publisher-marked prefix in PUBLIC (own key) is shared with opted-in tenants only."""
    from security.errors import AccessDenied
    from security.principals import AccessPolicy
    from security.publishing import PublishGrants

    cache.add_tenant("_public")
    grants = PublishGrants(cache.keyring.source)  # the operator lets "ops" publish
    grants.grant("ops", NOW)
    cache.policy = AccessPolicy(grants=grants)
    schema = dataclasses.replace(BASE, tenant="_public", session="tool-schemas").digest()
    admin = cache.issuer.issue("ops", subject="root", now=NOW, roles=["admin", "publish"])
    with pytest.raises(AccessDenied):  # an admin token without the publish role
        cache.put(cache.issuer.issue("ops", subject="root", now=NOW, roles=["admin"]), schema,
                  Tier.HOST, b"x", NOW, public=True)
    opted = cache.issuer.issue("acme", subject="svc", now=NOW, public_read=True)
    with pytest.raises(AccessDenied):  # tenants cannot publish
        cache.put(tokens["acme"], schema, Tier.HOST, b"x", NOW, public=True)
    page = _page(2048)
    cache.put(admin, schema, Tier.HOST, page, NOW, public=True)
    assert cache.lookup(opted, schema, NOW) == (Lookup.MISS, None)  # not marked public yet
    cache.policy.mark_public(cache.issuer.verify(admin, NOW), schema)
    assert cache.lookup(opted, schema, NOW) == (Lookup.HIT, page)
    assert cache.lookup(tokens["acme"], schema, NOW) == (Lookup.MISS, None)  # no opt-in
    assert cache.lookup(tokens["globex"], schema, NOW) == (Lookup.MISS, None)
    slot = cache.next_slot[Tier.HOST] - 1  # sealed under the PUBLIC key, bound to PUBLIC
    with pytest.raises(InvalidSeal):
        cache.sealer.open("acme", schema, 1, Tier.HOST, slot, cache.tiers.read(Tier.HOST, slot))
