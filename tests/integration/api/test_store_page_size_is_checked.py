"""A page larger than the service's page size, or an
empty one, is refused with ``bad_args`` naming the limit before anything is staged, and
loses nothing: the session's pages stored before and after it load back byte for byte,
and another tenant's page on the same service is untouched. Real local service (Ray
actors, shared-memory staging), real sockets."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration
PAGE_BYTES = 1 << 17


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-pagesize-", page_bytes=PAGE_BYTES, hbm_pages=8,
                       pool_bytes=4 << 20) as svc:
        yield svc


def test_an_oversized_or_empty_page_is_bad_args_and_loses_nothing(service) -> None:
    with service.client("acme") as acme, service.client("globex") as globex:
        s, g = acme.open_session("sizes"), globex.open_session("neighbour")
        before = kv_page(0, "evidence", identity("acme", "sizes", 0))
        theirs = kv_page(0, "evidence", identity("globex", "neighbour", 0))
        assert len(before["data"]) == PAGE_BYTES
        (k0,) = s.store_pages([before])
        (kg,) = g.store_pages([theirs])
        # shape and data agree: only the service's page size refuses them
        big = kv_page(1, "evidence", identity("acme", "sizes", 1000), tokens=136)
        assert len(big["data"]) > PAGE_BYTES
        empty = dict(kv_page(2, "evidence", identity("acme", "sizes", 2000), tokens=0))
        assert empty["data"] == b""
        for bad in (big, empty):
            with pytest.raises(RemoteError) as err:
                s.store_pages([bad])
            assert err.value.code == "bad_args", err.value
            print("REFUSED:", len(bad["data"]), err.value.code, err.value.message)
            assert str(PAGE_BYTES) in err.value.message
        after = kv_page(3, "evidence", identity("acme", "sizes", 3000))
        (k3,) = s.store_pages([after])
        assert s.load([k0, k3]) == [before["data"], after["data"]]
        assert g.load([kg]) == [theirs["data"]]
