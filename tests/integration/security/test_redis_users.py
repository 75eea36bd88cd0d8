"""The service's per-tenant Redis users on a real redis-server: made for every tenant with
keys, confined to its blinded namespace, removed with its credentials on erasure."""

from __future__ import annotations

import json

import pytest
import redis

from agentkv_cluster.runtime.redis_users import TenantRedisUsers
from agentkv_cluster.runtime.tenants import ensure_tenant
from security.blinding import DirectoryBlinder
from security.keyring import FileKeySource, TenantKeyring
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration


@pytest.fixture()
def server():
    proc = RedisProcess().start()
    yield proc
    proc.close()


def test_each_tenant_gets_a_confined_user_that_erasure_removes(server, tmp_path) -> None:
    keys = str(tmp_path / "keys")
    for tenant in ("acme", "globex"):
        ensure_tenant(keys, tenant)
    users = TenantRedisUsers(server.url, keys, tmp_path / "users")
    try:
        assert users.reconcile() == (["acme", "globex"], [])
        assert users.reconcile() == ([], [])  # nothing new
        cred = json.loads((tmp_path / "users" / "acme.json").read_text())
        assert (tmp_path / "users" / "acme.json").stat().st_mode & 0o777 == 0o600
        blinder = DirectoryBlinder(TenantKeyring(FileKeySource(keys)))
        own, other = blinder.namespace("acme"), blinder.namespace("globex")
        assert cred["namespace"] == own
        client = redis.Redis(host="127.0.0.1", port=server.port, username=cred["username"],
                             password=cred["password"])
        client.set(f"akv:{{{own}}}:e:x", b"1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get(f"akv:{{{other}}}:e:x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.keys("*")
        client.close()

        TenantKeyring(FileKeySource(keys)).destroy_tenant("acme")  # erased: keys first
        assert users.remove("acme") == 1
        assert not (tmp_path / "users" / "acme.json").exists()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port, username=cred["username"],
                        password=cred["password"]).ping()
        # a tenant whose keys were destroyed elsewhere loses its user on the next pass
        TenantKeyring(FileKeySource(keys)).destroy_tenant("globex")
        assert users.reconcile() == ([], ["globex"])
    finally:
        users.close()


def test_users_follow_the_directorys_key_prefix(server, tmp_path) -> None:
    """With ``directory.prefix`` set, the service writes ``<prefix>:{ns}:*``: the tenant's
    user is confined to that (it used to be to ``akv:{ns}:*`` whatever the prefix, so
    every write of the service's tenant users would be refused), and a user file made
    for another prefix is made again."""
    keys = str(tmp_path / "keys")
    ensure_tenant(keys, "acme")
    ns = DirectoryBlinder(TenantKeyring(FileKeySource(keys))).namespace("acme")
    TenantRedisUsers(server.url, keys, tmp_path / "users").reconcile()  # default prefix
    users = TenantRedisUsers(server.url, keys, tmp_path / "users", prefix="custom")
    try:
        assert users.reconcile() == (["acme"], [])
        cred = json.loads((tmp_path / "users" / "acme.json").read_text())
        assert cred["prefix"] == "custom"
        client = redis.Redis(host="127.0.0.1", port=server.port, username=cred["username"],
                             password=cred["password"])
        client.set(f"custom:{{{ns}}}:e:x", b"1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(f"akv:{{{ns}}}:e:x", b"1")
        client.close()
    finally:
        users.close()
