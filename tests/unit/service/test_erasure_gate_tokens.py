"""``ErasureGate.check`` on its own, with a real key
directory and the mark ``agentkv tenant erase`` leaves: a token issued at or before the
tenant's erasure is void for good (``Unauthenticated``), one issued after it is held
(``TenantErased``, retry) until this service has purged the old tenant (``enforced``),
and then passes; another tenant is never touched."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.api.errors import TenantErased, Unauthenticated
from agentkv_cluster.runtime.front import ErasureGate
from security.keyring import FileKeySource, TenantKeyring
from security.principals import Principal


def _principal(tenant: str, issued: float) -> Principal:
    return Principal(tenant=tenant, subject="s", roles=frozenset({"tenant"}),
                     public_read=False, expires=time.time() + 600, issued=issued)


def test_tokens_from_before_an_erasure_are_void_and_later_ones_wait_for_the_purge(tmp_path):
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    for tenant in ("acme", "globex"):
        ring.create_tenant(tenant)
    gate = ErasureGate(ring, str(keys))
    held: list[int] = []
    gate.on_pending = lambda: held.append(1)
    t0 = time.time()
    old, other = _principal("acme", t0 - 5), _principal("globex", t0 - 5)
    gate.check(old)  # control: nothing erased yet
    at = t0 - 1.0
    ring.mark_erased("acme", at)  # the CLI's erasure (keys destroyed elsewhere)
    ring.destroy_tenant("acme")
    gate.forget("acme")  # as if the directory's change was seen
    with pytest.raises(Unauthenticated, match="predates"):
        gate.check(old)
    with pytest.raises(Unauthenticated):
        gate.check(_principal("acme", at))  # issued at the very moment: void too
    new = _principal("acme", t0)
    with pytest.raises(TenantErased, match="retry"):
        gate.check(new)  # valid, but this service has not purged the old tenant yet
    assert held  # and the purge was woken
    gate.check(other)  # untouched
    gate.enforced("acme", gate.erased_at("acme"))  # the mark (rounded up to its ms)
    gate.check(new)  # purged here: the name starts again, empty
    with pytest.raises(Unauthenticated):
        gate.check(old)  # the old token stays void
