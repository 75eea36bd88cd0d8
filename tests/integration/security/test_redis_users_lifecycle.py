"""The tenants' Redis users across the service's own life, on a real redis-server: a
user made by an earlier run is removed by the erasure of a later one, a removal while
Redis is down fails (the erasure step retries) and keeps the credentials, a reconcile
while Redis is down makes the users on the next pass, and a service user without ACL
rights stops trying (logged once)."""

from __future__ import annotations

import json
import logging

import pytest
import redis

from agentkv_cluster.runtime.redis_users import TenantRedisUsers
from agentkv_cluster.runtime.tenants import ensure_tenant
from security.keyring import FileKeySource, TenantKeyring
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
LOGGER = "agentkv_cluster.runtime.redis_users"


@pytest.fixture()
def server():
    proc = RedisProcess().start()
    yield proc
    proc.close()


def _login(server: RedisProcess, cred: dict) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, username=cred["username"],
                       password=cred["password"])


def test_a_user_made_by_an_earlier_run_is_removed_by_a_later_erasure(server, tmp_path) -> None:
    keys, out = str(tmp_path / "keys"), tmp_path / "users"
    ensure_tenant(keys, "acme")
    first = TenantRedisUsers(server.url, keys, out)
    assert first.reconcile() == (["acme"], [])
    first.close()
    cred = json.loads((out / "acme.json").read_text())
    later = TenantRedisUsers(server.url, keys, out)  # the service restarted
    try:
        TenantKeyring(FileKeySource(keys)).destroy_tenant("acme")
        assert later.remove("acme") == 1
        assert not (out / "acme.json").exists()
        with pytest.raises(redis.exceptions.AuthenticationError):
            _login(server, cred).ping()
    finally:
        later.close()


def test_a_removal_while_redis_is_down_fails_and_keeps_the_credentials(server, tmp_path) -> None:
    keys, out = str(tmp_path / "keys"), tmp_path / "users"
    ensure_tenant(keys, "acme")
    users = TenantRedisUsers(server.url, keys, out)
    try:
        assert users.reconcile() == (["acme"], [])
        TenantKeyring(FileKeySource(keys)).destroy_tenant("acme")
        server.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            users.remove("acme")
        assert (out / "acme.json").exists()  # the erasure step retries with it
        server.start()
        assert users.remove("acme") == 1 and not (out / "acme.json").exists()
    finally:
        users.close()


def test_a_reconcile_while_redis_is_down_makes_the_users_on_the_next_pass(server,
                                                                          tmp_path) -> None:
    keys = str(tmp_path / "keys")
    ensure_tenant(keys, "acme")
    users = TenantRedisUsers(server.url, keys, tmp_path / "users")
    try:
        server.stop()
        assert users.reconcile() == ([], [])
        server.start()
        assert users.reconcile() == (["acme"], [])
        cred = json.loads((tmp_path / "users" / "acme.json").read_text())
        client = _login(server, cred)
        assert client.ping()
        client.close()
    finally:
        users.close()


def test_a_service_user_without_acl_rights_stops_trying(server, tmp_path, caplog) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser("svc", enabled=True, passwords=["+svcpw"], keys=["*"],
                      commands=["+@all", "-@admin", "-@dangerous"])
    admin.close()
    keys = str(tmp_path / "keys")
    for tenant in ("acme", "globex"):
        ensure_tenant(keys, tenant)
    url = f"redis://svc:svcpw@127.0.0.1:{server.port}/0"
    users = TenantRedisUsers(url, keys, tmp_path / "users")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        assert users.reconcile() == ([], [])
        assert users.reconcile() == ([], [])
        warned = [r for r in caplog.records if "cannot create Redis users" in r.getMessage()]
        assert len(warned) == 1 and users.disabled
    finally:
        users.close()


def test_users_a_redis_restart_lost_are_made_again_with_their_passwords(server, tmp_path,
                                                                        caplog) -> None:
    """``ACL SETUSER`` users live in Redis's memory only: a restart (or a failover to a
    replica) loses them, and the service, which counted them as made, never made them
    again, so each tenant's credentials file stopped working until the service restarted."""
    keys, out = str(tmp_path / "keys"), tmp_path / "users"
    for tenant in ("acme", "globex"):
        ensure_tenant(keys, tenant)
    users = TenantRedisUsers(server.url, keys, out)
    try:
        assert users.reconcile() == (["acme", "globex"], [])
        creds = {t: json.loads((out / f"{t}.json").read_text()) for t in ("acme", "globex")}
        server.restart()  # no persistence here; an RDB or AOF would not hold them either
        for cred in creds.values():
            with pytest.raises(redis.exceptions.AuthenticationError):
                _login(server, cred).ping()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            made = users.reconcile()[0]
            if not made:  # the first pass found Redis still starting: the next one asks
                made = users.reconcile()[0]
        assert made == ["acme", "globex"]
        assert "lost 2 tenant user(s)" in caplog.text and "acme" not in caplog.text
        for cred in creds.values():  # the same passwords: the tenants' tools go on
            assert _login(server, cred).ping()
        assert users.reconcile() == ([], [])  # nothing lost: nothing made again
    finally:
        users.close()
