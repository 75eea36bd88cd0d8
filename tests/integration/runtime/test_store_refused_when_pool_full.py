"""A store that needs room while the pool has room on no tier is refused at once as
``busy``, naming the full tiers, and a load that has no room to restore into is ``busy``
too (the service in this process: real NIXL, /dev/shm, AES-GCM and NVMe shard). Before,
the store retried its demotions for 30 s and answered ``bad_args: HBM is full of pinned
pages``, and the load ``page_lost`` though the page's copy was safe in the pool."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import ErrorCode, RemoteError
from agentkv_cluster.runtime.pool_geometry import nvme_record_bytes
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration
PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry


@pytest.fixture
def service():
    # an arena of 5 pages (4 and a landing page), a budget of 2: failed demotions leave
    # pages over the budget until the arena itself is full; LRU: every demotion a FULL
    # copy, so the pool fills predictably; two host slots and one NVMe record
    with local_service("agentkv-full-", page_bytes=PAGE, hbm_pages=4, pool_bytes=2 * PAGE,
                       hbm={"landing_pages": 1}, controller={"policy": "lru"},
                       pool={"nvme_bytes": nvme_record_bytes(PAGE)},
                       hbm_capacity=2 * PAGE) as svc:
        yield svc


def test_a_store_that_needs_room_in_a_full_pool_is_refused_as_busy(service) -> None:
    with service.client("acme") as client:
        session = client.open_session("full")
        stored = []
        with pytest.raises(RemoteError) as refused:
            for i in range(12):  # 5 fit the arena, 3 the pool: the 9th finds no room anywhere
                stored += session.store_pages(
                    [kv_page(i, "evidence", identity("acme", "full", 1000 * i))])
        assert refused.value.code == ErrorCode.BUSY.value, refused.value
        assert "tiers are full" in str(refused.value)
        assert len(stored) == 8
        # Nothing stored before is lost: a page still in HBM loads; one in the pool has no
        # room to come back while every arena page holds a page that has nowhere to go, and
        # says so (busy), never page_lost.
        loaded = 0
        for key in stored:
            try:
                loaded += len(session.load([key]))
                session.release([key])
            except RemoteError as exc:
                assert exc.code == ErrorCode.BUSY.value and "no room" in str(exc), exc
        assert loaded == 5  # the arena's pages
        assert service.topo.pools["node0"].stats()["copies"] == 3
