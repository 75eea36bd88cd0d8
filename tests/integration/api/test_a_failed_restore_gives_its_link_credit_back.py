"""A restore that fails (its pool copy is gone: the pool
was reset under the controller) is refused as ``page_lost`` and gives its link credit
back (released in a ``finally``): a credit kept by each failed restore would drain the
link until no restore of it could start (real local service: shared memory, real actors
in this process)."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 1 << 17  # kv_page's geometry


def test_a_failed_restore_leaves_no_credit_in_flight() -> None:
    with local_service("agentkv-credit-", page_bytes=PAGE, hbm_pages=2,
                       pool_bytes=16 * PAGE) as svc:
        executor = svc.topo.controller.target.executor  # local mode: the actor itself
        with svc.client("acme") as client:
            a = client.open_session("a")
            keys = a.store_pages([kv_page(i, "evidence", identity("acme", "a", i))
                                  for i in range(2)])
            b = client.open_session("b")
            b.store_pages([kv_page(i, "evidence", identity("acme", "b", i)) for i in range(2)])
            for pool in svc.topo.pools.values():  # a's copies, pushed out for b's, go
                pool.target.reset()
            with pytest.raises(RemoteError) as err:
                a.load(keys)
            assert err.value.code == "page_lost"
        assert sum(executor.credits.in_flight.values()) == 0
