"""Once the
service enforced the erasure of one generation (``agentkv tenant erase T --generation G``
from the CLI), a record sealed under it (a copy taken before: a /dev/shm snapshot, an NVMe
backup) does not open in the running pool: its cached data key went with the KEK file.
Real local service (in-process actors), /dev/shm host pool, key files, the real CLI."""

from __future__ import annotations

import time

import pytest

from security.errors import InvalidSeal
from store.types import Tier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_erase_generation_live import _cli, _enforced
from tests.integration.runtime.test_public_mark import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _host_records(pool, keys):
    out = []
    with pool._lock:
        for (key, _codec), copy in list(pool._index.items()):
            if key in keys and copy.tier is Tier.HOST:
                out.append((copy, bytes(pool.host.read(copy.slot))))
    return out


def test_a_record_of_an_erased_generation_does_not_open_in_the_running_pool() -> None:
    with local_service("agentkv-erase-gen-keys-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=12 * PAGE, hbm_capacity=3 * PAGE) as service, \
            service.client("acme") as client:
        s = client.open_session("g1")
        keys = set(s.store_pages([kv_page(i, "evidence", identity("acme", "g1", 1000 * i))
                                  for i in range(5)]))  # three fit HBM, two go to the pool
        pools = [p.target for p in service.topo.pools.values()]
        held = [(pool, c, r) for pool in pools for c, r in _host_records(pool, keys)
                if c.seal_gen == 1]
        assert held, "control: generation 1 has host-pool copies"
        for pool, copy, record in held:  # control: they open now
            assert pool.chunked.read_meta(record, int(copy.tier), "acme", 1).nbytes
        assert _cli(service, "rotate", "acme") == 0
        assert _cli(service, "erase", "acme", "--generation", "1") == 0
        deadline = time.monotonic() + 10.0
        while not [d for d in _enforced(service) if d.get("generation") == 1]:
            assert time.monotonic() < deadline, "the service did not enforce the erasure"
            time.sleep(0.1)
        for pool, copy, record in held:
            with pytest.raises(InvalidSeal):
                pool.chunked.read_meta(record, int(copy.tier), "acme", 1)
