"""Operator grants to publish into PUBLIC, kept in a real key directory: granted, revoked,
voided by the tenant's erasure (even where the entry stayed), re-read by the cache."""

from __future__ import annotations

import pytest

from security.audit import AuditLog
from security.erasure import Eraser
from security.errors import InvalidName
from security.keyring import PUBLIC_NAMESPACE, FileKeySource, TenantKeyring, erased_name
from security.publishing import CachedGrants, PublishGrants, grant_name
from security.signing import Signer

NOW = 1_700_000_000.0


@pytest.fixture
def grants(tmp_path) -> PublishGrants:
    return PublishGrants(FileKeySource(tmp_path / "keys"))


def test_grant_then_revoke(grants):
    assert not grants.allows("acme")
    grant = grants.grant("acme", NOW)
    assert grant.live and grant.granted_at == NOW
    assert grants.allows("acme") and not grants.allows("globex")
    grants.grant("acme", NOW + 5)  # a second grant adds a newer entry
    assert grants.revoke("acme") == 2
    assert not grants.allows("acme") and grants.grants() == {}


def test_public_and_bad_names_cannot_be_granted(grants):
    for bad in (PUBLIC_NAMESPACE, "Acme", "../x", ""):
        with pytest.raises(InvalidName):
            grants.grant(bad, NOW)


def test_a_grant_older_than_the_erasure_mark_is_void(grants):
    grants.grant("acme", NOW)
    grants.source.create(erased_name("acme", NOW), b"")  # erased in the grant's millisecond
    assert not grants.allows("acme") and not grants.grants()["acme"].live
    grants.grant("acme", NOW + 0.002)  # granted again after the erasure
    assert grants.allows("acme")


def test_erasing_a_tenant_removes_its_grant(tmp_path):
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("acme")
    grants = PublishGrants(ring.source)
    grants.grant("acme", NOW)
    eraser = Eraser(ring, AuditLog(tmp_path / "audit.log", Signer.generate()), Signer.generate())
    eraser.erase_tenant("acme", NOW + 1)
    assert grants.grants() == {}
    assert not any(".publish." in n for n in ring.source.names())


def test_the_cache_shows_a_grant_and_a_revocation_after_its_max_age(grants):
    clock = [0.0]
    cached = CachedGrants(grants, max_age_s=1.0, clock=lambda: clock[0])
    assert not cached.allows("acme")
    grants.grant("acme", NOW)
    assert not cached.allows("acme")  # read 0 s ago
    clock[0] = 1.0
    assert cached.allows("acme")
    grants.revoke("acme")
    cached.forget()  # an erasure in this process re-reads at once
    assert not cached.allows("acme")


def test_grant_entries_are_not_taken_for_keys(tmp_path):
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("acme")
    PublishGrants(ring.source).grant("acme", NOW)
    assert grant_name("acme", NOW) in ring.source.names()
    assert ring.tenants() == ["acme"] and ring.generations("acme") == [1]
    assert ring.erased_at("acme") is None
