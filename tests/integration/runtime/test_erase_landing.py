"""Tenant erasure and the executor's landing pages: a page reserved for one-hop restores is
not zeroed when reserved, so one in stock may still hold a page of the tenant being erased.
The erasure takes the stock back zeroed; no byte of the tenant's pages is left in the arena.
(Service in local mode: every actor in this process, real NIXL and /dev/shm.)"""

from __future__ import annotations

import time

import pytest

from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture
def service():
    with local_service("agentkv-erase-landing-", page_bytes=PAGE, hbm_pages=2,
                       pool_bytes=4 << 20, hbm={"landing_pages": 2},
                       hbm_capacity=2 * PAGE) as svc:
        yield svc


def test_erasure_zeroes_landing_pages_held_in_stock(service) -> None:
    hbm = service.topo.hbms["node0-hbm0"].target
    client = service.client("acme")
    session = client.open_session("e1")
    pages = [kv_page(i, "evidence", identity("acme", "e1", 1000 * i)) for i in range(4)]
    keys = session.store_pages(pages)  # room for two: the first two go to the host pool,
    marks = [p["data"][4096:4160] for p in pages]  # their arena pages freed, bytes kept
    prepared = session.prepare_load(keys[:1])  # a restore stocks the executor's landing pages
    session.complete_load(prepared["load_id"])
    deadline = time.monotonic() + 10.0
    while not hbm.pages._landing and time.monotonic() < deadline:
        time.sleep(0.02)

    def stocked_with_acme() -> int:
        arena = hbm.arena
        return sum(any(m in arena.view(p).numpy().tobytes() for m in marks)
                   for p in list(hbm.pages._landing))

    assert stocked_with_acme() >= 1  # the case this test is about: a page reserved unzeroed
    receipt = service.erase_tenant("acme")
    assert receipt.failed_tiers == ()
    assert hbm.arena_holds(marks) == [False] * len(marks)
    client.close()
