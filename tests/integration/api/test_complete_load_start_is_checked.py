"""``complete_load``'s ``start`` outside 0..n (the load's
page count) is bad input: refused as ``bad_args``, and the load is kept (served whole
afterwards). Unchecked, a start past the end was answered with no pages and ``next``
None (a client took the load as complete), and a negative one served pages from the
end."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 1 << 17  # kv_page's geometry


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-start-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=16 * PAGE) as svc:
        yield svc


def test_a_start_outside_the_load_is_refused_and_the_load_kept(service) -> None:
    with service.client("acme") as client:
        s = client.open_session("start-checked")
        pages = [kv_page(i, "evidence", identity("acme", "start-checked", 1000 * i))
                 for i in range(2)]
        keys = s.store_pages(pages)
        load_id = s.prepare_load(keys)["load_id"]
        for start in (-1, 3):
            with pytest.raises(RemoteError) as err:
                s._call("complete_load", load_id=load_id, start=start)
            assert err.value.code == "bad_args" and "start must be 0..2" in err.value.message
        done = s.complete_load(load_id)["pages"]
        s.release(keys)
    assert [p["data"] for p in done] == [p["data"] for p in pages]
