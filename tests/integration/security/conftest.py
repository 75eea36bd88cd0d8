"""Real redis-server (ACL, debug command and slow log on) and real tiers for the security suite."""

from __future__ import annotations

import os

import pytest
import redis

from security.keyring import FileKeySource, TenantKeyring
from security.principals import TokenIssuer
from tests.integration.security.harness import RealTiers, SecureCache
from tests.support.redis_proc import RedisProcess

NOW = 1_764_403_200.25  # a fixed request time, so the leak scan knows what to look for


@pytest.fixture
def acl_redis():
    """A private server that would answer DEBUG and logs every command in the slow log."""
    server = RedisProcess(extra_config="enable-debug-command yes\nslowlog-log-slower-than 0\n"
                                       "slowlog-max-len 100000").start()
    yield server
    server.close()


@pytest.fixture
def cache(tmp_path, acl_redis):
    admin = redis.Redis.from_url(acl_redis.url)
    tiers = RealTiers(tmp_path, slots=64, slot_bytes=40_000)
    c = SecureCache(keyring=TenantKeyring(FileKeySource(tmp_path / "keys")), tiers=tiers,
                    issuer=TokenIssuer(os.urandom(32)), redis_port=acl_redis.port, admin=admin)
    for tenant in ("acme", "globex"):
        c.add_tenant(tenant)
    yield c
    c.close()
    tiers.close()
    admin.close()


@pytest.fixture
def tokens(cache) -> dict[str, str]:
    return {t: cache.issuer.issue(t, subject=f"svc-{t}", now=NOW) for t in ("acme", "globex")}
