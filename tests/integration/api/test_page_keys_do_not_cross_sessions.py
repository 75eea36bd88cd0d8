"""A page key returned by ``store_pages`` is not a
bearer capability: presented by another tenant (a leaked key: in a log, a trace, a shared
notebook), or by another session of the same tenant that never stored or looked the page
up, ``prepare_load`` and ``release`` answer ``not_found`` and serve no bytes, and the
owner still loads its page afterwards. Keys are looked up per HBM actor, not per tenant;
the session's membership check (``PageTable.resolve``) is the boundary. Real local
service (Ray actors, shared memory), real sockets."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-keys-", page_bytes=1 << 17, hbm_pages=8,
                       pool_bytes=4 << 20) as svc:
        yield svc


def test_a_leaked_page_key_serves_nobody_else(service) -> None:
    # globex opted in to PUBLIC: that opt-in must not stretch to another tenant's pages
    with service.client("acme") as acme, \
            service.client("globex", public_read=True) as globex:
        s = acme.open_session("secret")
        page = kv_page(0, "evidence", identity("acme", "secret", 0))
        (key,) = s.store_pages([page])
        spies = [globex.open_session("spy"), acme.open_session("sibling")]
        for spy in spies:
            for call in (spy.prepare_load, spy.release):
                with pytest.raises(RemoteError) as err:
                    call([key])
                assert err.value.code == "not_found", err.value
        assert s.load([key]) == [page["data"]]  # the owner is untouched
