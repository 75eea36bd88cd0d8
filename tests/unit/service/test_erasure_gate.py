"""The front refuses every call of a tenant this service is erasing from the moment the
erasure begins, before its mark is written: the controller's freeze does not see a
``complete_load``, which the front serves from HBM itself (found by review)."""

from __future__ import annotations

import time

import pytest

from agentkv_cluster.api.errors import TenantErased
from agentkv_cluster.runtime.front import ErasureGate
from security.keyring import FileKeySource, TenantKeyring
from security.principals import Principal


def test_a_frozen_tenant_is_refused_until_the_erasure_ends(tmp_path) -> None:
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("acme")
    gate = ErasureGate(ring, str(tmp_path / "keys"))
    acme, other = (Principal(tenant=t, subject="s", roles=frozenset({"tenant"}),
                             public_read=False, expires=time.time() + 60, issued=time.time())
                   for t in ("acme", "globex"))
    gate.check(acme)
    gate.freeze("acme")
    with pytest.raises(TenantErased, match="being erased"):
        gate.check(acme)
    gate.check(other)  # another tenant is untouched
    gate.forget("acme")  # the erasure ended (its mark, if any, is checked from now on)
    gate.check(acme)
