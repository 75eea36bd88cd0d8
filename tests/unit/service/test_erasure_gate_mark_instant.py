"""``ErasureGate.check`` at the mark's own instant: the mark is stored rounded up to its
millisecond, so a token issued at the time the erasure was asked for is older than it
anyway; one issued at the very instant the mark reads is void too ("at or before"), not
merely held until the purge."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.api.errors import Unauthenticated
from agentkv_cluster.runtime.front import ErasureGate
from security.keyring import FileKeySource, TenantKeyring
from security.principals import Principal


def _principal(tenant: str, issued: float) -> Principal:
    return Principal(tenant=tenant, subject="s", roles=frozenset({"tenant"}),
                     public_read=False, expires=time.time() + 600, issued=issued)


def test_a_token_issued_at_the_marks_instant_is_void_even_after_the_purge(tmp_path) -> None:
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("acme")
    gate = ErasureGate(ring, str(keys))
    ring.mark_erased("acme", time.time() - 1.0)
    ring.destroy_tenant("acme")
    gate.forget("acme")
    at = gate.erased_at("acme")
    assert at is not None
    with pytest.raises(Unauthenticated, match="predates"):
        gate.check(_principal("acme", at))
    gate.enforced("acme", at)  # purged here: later tokens pass, that one stays void
    with pytest.raises(Unauthenticated, match="predates"):
        gate.check(_principal("acme", at))
    gate.check(_principal("acme", at + 0.001))
