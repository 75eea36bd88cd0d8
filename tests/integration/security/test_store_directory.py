"""The store's real RedisDirectory under the generated per-tenant ACL users, with blinded keys:
it works inside a tenant's namespace, is refused outside it, and stores nothing plaintext."""

from __future__ import annotations

import pytest
import redis

from security import redis_acl
from security.blinding import DirectoryBlinder, size_bucket
from security.isolation import ProbeMarkers, scan_for_leaks
from security.keyring import FileKeySource, TenantKeyring
from store.types import Codec, Lookup, Tier
from tests.integration.security.conftest import NOW

backend = pytest.importorskip("store.directory.redis_backend")
base = pytest.importorskip("store.directory.base")

pytestmark = pytest.mark.integration
LENGTHS = {"acme": (12_345, 23_456), "globex": (31_337, 40_961)}


def test_redis_directory_with_tenant_acls(tmp_path, acl_redis):
    keyring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    blinder = DirectoryBlinder(keyring)
    admin = redis.Redis.from_url(acl_redis.url)
    dirs, spaces = {}, {}
    for tenant in ("acme", "globex"):
        keyring.create_tenant(tenant)
        spaces[tenant] = ns = blinder.namespace(tenant)
        user = redis_acl.make_user(ns)
        redis_acl.apply_users(admin, [user])
        dirs[tenant] = backend.RedisDirectory(
            f"redis://{user.username}:{user.password}@127.0.0.1:{acl_redis.port}/0")
        assert dirs[tenant].open_generation(ns) == 1
        for i, length in enumerate(LENGTHS[tenant]):
            digest = bytes([i]) * 32
            dirs[tenant].put(base.DirectoryEntry(
                key=blinder.blind_key(tenant, digest), tenant_ns=ns, tier=Tier.HOST, node="node-0",
                location=f"pool:{i}", codec=Codec.INT8, size_bucket=size_bucket(length), generation=1))
    digest = bytes([0]) * 32
    found, entry = dirs["acme"].get(spaces["acme"], blinder.blind_key("acme", digest))
    assert found is Lookup.HIT and entry.size_bucket == 16_384 and entry.location == "pool:0"
    # Same identity through B's own namespace: B's blinded key is unrelated, so a miss.
    assert dirs["globex"].get(spaces["globex"], blinder.blind_key("globex", b"\x07" * 32)) == (
        Lookup.MISS, None)
    # B's credentials against A's namespace: refused by Redis, not merely missed.
    with pytest.raises(base.DirectoryAccessDenied):
        dirs["globex"].get(spaces["acme"], blinder.blind_key("acme", digest))
    with pytest.raises(base.DirectoryAccessDenied):
        dirs["globex"].open_generation(spaces["acme"])
    markers = ProbeMarkers(tool_names=("web_search",), lengths=LENGTHS["acme"] + LENGTHS["globex"],
                           timestamps=(NOW,), tenants=("acme", "globex"))
    assert admin.dbsize() > 4  # control: the directory wrote entries, refcounts, generation sets
    assert scan_for_leaks(admin, markers) == []
    for d in dirs.values():
        d.close()
    admin.close()
