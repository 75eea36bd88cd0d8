"""Redis directory on real servers: restarts, ACL confinement, key layout, outages."""

from __future__ import annotations

import pytest
import redis

from store.directory import (
    CredentialsRefused,
    DirectoryAccessDenied,
    DirectoryEntry,
    DirectoryUnavailable,
    GenerationRegression,
)
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Lookup, Tier
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration


def entry(key: bytes, generation: int, ns: str = "acme") -> DirectoryEntry:
    return DirectoryEntry(
        key=key,
        tenant_ns=ns,
        tier=Tier.HOST,
        node="n1",
        location="pool:3",
        codec=Codec.FULL,
        size_bucket=1,
        generation=generation,
    )


def test_generation_survives_a_server_restart(fresh_redis):
    survivor = RedisDirectory(fresh_redis.url)
    for _ in range(3):
        survivor.open_generation("acme")
    survivor.put(entry(b"a", 3))
    fresh_redis.restart()  # no persistence: the server comes back empty

    newcomer = RedisDirectory(fresh_redis.url)
    assert newcomer.current_generation("acme") == 0  # it cannot know; the service repopulates
    newcomer.advance_generation("acme", 3)
    with pytest.raises(GenerationRegression):
        newcomer.advance_generation("acme", 2)
    # The client that saw generation 3 never goes below it, and heals the server.
    assert survivor.open_generation("acme") == 4
    assert newcomer.current_generation("acme") == 4
    assert survivor.get("acme", b"a") == (Lookup.MISS, None)
    survivor.close()
    newcomer.close()


def test_empty_restarted_server_cannot_lower_a_clients_generation(fresh_redis):
    d = RedisDirectory(fresh_redis.url)
    for _ in range(5):
        d.open_generation("acme")
    fresh_redis.restart()
    assert d.current_generation("acme") == 5
    with pytest.raises(GenerationRegression):
        d.advance_generation("acme", 4)
    d.close()


def test_key_layout_is_per_namespace_with_hash_tags(redis_server):
    d = RedisDirectory(redis_server.url, prefix="layout")
    d.open_generation("acme")
    d.put(entry(b"\x01\x02", 1))
    d.incref("acme", b"\x01\x02")
    raw = redis.Redis.from_url(redis_server.url)
    assert sorted(k.decode() for k in raw.scan_iter("layout:*")) == [
        "layout:{acme}:e:0102",
        "layout:{acme}:g:1",
        "layout:{acme}:gens",
        "layout:{acme}:meta",
        "layout:{acme}:r:0102",
        "layout:{acme}:w:n1",  # node n1's writes in acme, counted with each entry
    ]
    assert raw.get("layout:{acme}:r:0102") == b"1"
    assert raw.get("layout:{acme}:w:n1") == b"1"
    raw.close()
    d.close()


def test_acl_key_pattern_confines_a_tenant_to_its_namespace():
    acl = "user acme on >acme-pass ~akv:{acme}:* resetchannels +@all"
    server = RedisProcess(extra_config=acl).start()
    try:
        d = RedisDirectory(f"redis://acme:acme-pass@127.0.0.1:{server.port}/0")
        gen = d.open_generation("acme")
        d.put(entry(b"a", gen))
        assert d.get("acme", b"a")[0] is Lookup.HIT
        with pytest.raises(DirectoryAccessDenied):
            d.open_generation("globex")
        with pytest.raises(DirectoryAccessDenied):
            d.get("globex", b"a")
        d.close()
    finally:
        server.close()


@pytest.mark.parametrize("credentials", [":wrong@", "", "nobody:pw@"])
def test_refused_credentials_are_access_denied_not_unreachable(credentials):
    """A wrong password, none, or an unknown user: Redis answers, so the error must say the
    credentials were refused (not "unreachable"), and guarded callers still run local-only."""
    server = RedisProcess(extra_config="requirepass sekrit").start()
    try:
        d = RedisDirectory(f"redis://{credentials}127.0.0.1:{server.port}/0")
        with pytest.raises(DirectoryAccessDenied, match="refused the credentials") as caught:
            d.get("acme", b"a")
        assert isinstance(caught.value, DirectoryUnavailable)  # GuardedDirectory: local-only
        assert "unreachable" not in str(caught.value)
        with pytest.raises(CredentialsRefused):
            d.open_generation("acme")
        d.close()
    finally:
        server.close()


def test_unreachable_server_is_a_clean_error(fresh_redis):
    d = RedisDirectory(fresh_redis.url, socket_timeout_s=0.5)
    d.open_generation("acme")
    fresh_redis.stop()
    with pytest.raises(DirectoryUnavailable):
        d.get("acme", b"a")
    with pytest.raises(DirectoryUnavailable):
        d.open_generation("acme")
    d.close()
