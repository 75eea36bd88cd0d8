"""A page key names a page only to the sessions that hold
it: another tenant (or another session) on the same HBM actor that presents the key (a
leaked key, or one a client logged) is refused ``UnknownPageKey`` by
``PageTable.resolve``, which every load, release and pin resolves keys through: keys are
looked up per HBM actor, not per tenant, so the session check is the tenant boundary."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.records import UnknownPageKey
from tests.unit.service.test_session_close import _controller, _meta, _store


def test_another_tenants_page_key_resolves_for_nobody_else() -> None:
    ctl = _controller()  # one HBM actor: every session lives on it
    key = b"k" * 32
    (gid,) = _store(ctl, "acme", "a", [_meta("acme", "a", 0, key=key)])
    assert ctl.table.resolve("acme", "a", [key]) == [gid]  # control: the owner
    for tenant, session in (("globex", "spy"), ("acme", "other")):
        ctl.table.open_session(tenant, session)
        assert ctl.table.hbm_of(tenant, session) == ctl.table.hbm_of("acme", "a")
        with pytest.raises(UnknownPageKey):
            ctl.table.resolve(tenant, session, [key])
