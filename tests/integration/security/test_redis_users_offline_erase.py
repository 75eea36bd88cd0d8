"""A tenant erased while no service runs (``agentkv tenant erase`` on the state directory)
loses its Redis ACL user and its credentials file, on a real redis-server: with
``--redis-url`` the erase deletes the user itself; without it (or when the URL's user may
not delete users) the service's next start does, with the file. Both used to survive:
the service only removed users that its own run had made, and the erase never touched
them, so the erased tenant kept its login to Redis."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import redis

from agentkv_cluster.cli import main
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.redis_users import TenantRedisUsers
from agentkv_cluster.runtime.service import Service
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration
PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 128 KiB


@pytest.fixture()
def server():
    proc = RedisProcess().start()
    yield proc
    proc.close()


@pytest.fixture()
def state(tmp_path, capsys) -> Path:
    """A state directory whose tenants acme and globex have keys and an audit key."""
    keys = str(tmp_path / "keys")
    for tenant in ("acme", "globex"):
        assert main(["tenant", "create", tenant, "--keys-dir", keys]) == 0
    assert main(["audit", "keygen", "--private", str(tmp_path / "audit.key"),
                 "--public", str(tmp_path / "audit.pub")]) == 0
    capsys.readouterr()
    return tmp_path


def _erase(state: Path, capsys, *extra: str) -> str:
    """``agentkv tenant erase acme`` offline; its stderr."""
    rc = main(["tenant", "erase", "acme", "--keys-dir", str(state / "keys"),
               "--audit-log", str(state / "audit.log"),
               "--signing-key", str(state / "audit.key"), *extra])
    err = capsys.readouterr().err
    assert rc == 0, err
    return err


def _users_made(server: RedisProcess, state: Path) -> dict[str, dict]:
    """What a run of the service leaves: each tenant's user and credentials file."""
    users = TenantRedisUsers(server.url, str(state / "keys"), state / "redis-users")
    try:
        assert users.reconcile() == (["acme", "globex"], [])
    finally:
        users.close()
    return {t: json.loads((state / "redis-users" / f"{t}.json").read_text())
            for t in ("acme", "globex")}


def _logs_in(server: RedisProcess, cred: dict) -> bool:
    client = redis.Redis(host="127.0.0.1", port=server.port, username=cred["username"],
                         password=cred["password"])
    try:
        return bool(client.ping())
    except redis.exceptions.AuthenticationError:
        return False
    finally:
        client.close()


def _start(server: RedisProcess, state: Path) -> Service:
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "directory": {"redis_url": server.url},
        "hbm": {"page_bytes": PAGE, "num_pages": 4},
        "pool": {"pool_bytes": 2 * PAGE, "slot_bytes": PAGE,
                 "nvme_dir": tempfile.mkdtemp(dir=state, prefix="nv-")},
    })
    return Service(cfg, workdir=state).start(local=True)


def test_an_offline_erase_with_redis_url_deletes_the_tenants_user(server, state,
                                                                  capsys) -> None:
    cred = _users_made(server, state)
    _erase(state, capsys, "--redis-url", server.url)
    assert not _logs_in(server, cred["acme"])
    assert _logs_in(server, cred["globex"])


def test_a_tenant_erased_while_the_service_was_down_loses_its_user_at_the_next_start(
        server, state, capsys) -> None:
    cred = _users_made(server, state)
    _erase(state, capsys)  # no --redis-url: Redis is not touched
    assert _logs_in(server, cred["acme"])  # until a service runs again
    svc = _start(server, state)
    try:  # the start's own reconcile, before the service serves anything
        assert not _logs_in(server, cred["acme"])
        assert not (state / "redis-users" / "acme.json").exists()
        assert _logs_in(server, cred["globex"])
        assert (state / "redis-users" / "globex.json").exists()
    finally:
        svc.stop()


def test_an_erase_whose_redis_user_may_not_delete_users_leaves_it_to_the_next_start(
        server, state, capsys) -> None:
    cred = _users_made(server, state)
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser("svc", enabled=True, passwords=["+svcpw"], keys=["*"],
                      commands=["+@all", "-@admin", "-@dangerous"])
    admin.close()
    err = _erase(state, capsys, "--redis-url", f"redis://svc:svcpw@127.0.0.1:{server.port}/0")
    assert "did not delete the tenant's user" in err and "svcpw" not in err
    assert _logs_in(server, cred["acme"])
    users = TenantRedisUsers(server.url, str(state / "keys"), state / "redis-users")
    try:
        assert users.reconcile() == (["globex"], ["acme"])  # a later run of the service
    finally:
        users.close()
    assert not _logs_in(server, cred["acme"])
    assert not (state / "redis-users" / "acme.json").exists()


def test_a_start_while_redis_is_down_keeps_the_credentials_for_the_next_pass(
        server, state, capsys) -> None:
    cred = _users_made(server, state)
    _erase(state, capsys)
    users = TenantRedisUsers(server.url, str(state / "keys"), state / "redis-users")
    try:
        server.stop()
        assert users.reconcile() == ([], [])  # no error: the service starts on
        assert (state / "redis-users" / "acme.json").exists()
        server.start()  # no persistence: the users come back only as the service makes them
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser(cred["acme"]["username"], enabled=True,
                          passwords=[f"+{cred['acme']['password']}"])
        admin.close()
        assert users.reconcile() == (["globex"], ["acme"])
        assert not _logs_in(server, cred["acme"])
        assert not (state / "redis-users" / "acme.json").exists()
    finally:
        users.close()
