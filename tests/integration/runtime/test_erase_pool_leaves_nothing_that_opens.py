"""After a tenant's erasure on
a running service, its host-pool records are gone from the pool's shared memory (the
slots of its copies overwritten, free slots scrubbed), and a record sealed before the
erasure (a copy taken before it: a snapshot of /dev/shm, a backup of an NVMe file) does
not open in the running pool, not even once a tenant of the same name was provisioned
again: the pool forgot the erased tenant's cached keys. Real local service (in-process
actors), real /dev/shm host pool, real NVMe files, real key files."""

from __future__ import annotations

import pytest

from security.errors import InvalidSeal
from store.types import Tier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-erase-pool-", page_bytes=PAGE, hbm_pages=12, pool_bytes=4 << 20,
                       hbm_capacity=4 * PAGE) as svc:
        yield svc


def _host_records(pool, keys):
    """(key, copy, sealed bytes) of every host-pool copy of ``keys`` in ``pool``."""
    out = []
    with pool._lock:
        for (key, _codec), copy in list(pool._index.items()):
            if key in keys and copy.tier is Tier.HOST:
                out.append((key, copy, bytes(pool.host.read(copy.slot))))
    return out


def test_an_erased_tenants_pool_records_are_gone_and_never_open_again(service) -> None:
    client = service.client("acme")
    s = client.open_session("e1")
    pages = [kv_page(i, "evidence", identity("acme", "e1", 1000 * i)) for i in range(6)]
    keys = set(s.store_pages(pages))  # 6 pages, room for 4 in HBM: some are demoted
    pools = [p.target for p in service.topo.pools.values()]
    held = [(pool, rec) for pool in pools for rec in _host_records(pool, keys)]
    assert held, "control: the tenant has host-pool copies"
    for pool, (_key, copy, record) in held:  # control: they open now
        assert pool.chunked.read_meta(record, int(copy.tier), "acme", copy.seal_gen).nbytes
    client.close()

    service.erase_tenant("acme")

    for pool, (_key, _copy, record) in held:
        shm = bytes(pool.host._bytes)
        assert record[1024:1088] not in shm, "an erased record is still in the host pool"
    with service.client("acme") as again:  # a tenant of the name, provisioned anew
        s2 = again.open_session("e2")
        s2.store_pages([kv_page(0, "evidence", identity("acme", "e2", 0))])
        for pool, (_key, copy, record) in held:  # the pre-erasure record, replayed
            with pytest.raises(InvalidSeal):
                pool.chunked.read_meta(record, int(copy.tier), "acme", copy.seal_gen)
