"""One tenant's loads that wait for room must not hold every API worker thread: a tenant
pinned its whole HBM share and sent as many loads as there are workers, each waiting for
room (up to 45 s), and every other tenant's calls, ``open_session`` included, waited
behind them. Now one tenant's calls that can wait hold at most ``api.tenant_workers``
threads; the rest of its calls wait for a turn without one."""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry
WORKERS = 8
HBM_PAGES = 16


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-share-", page_bytes=PAGE, hbm_pages=HBM_PAGES,
                       pool_bytes=64 * PAGE,
                       api={"workers": WORKERS, "tenant_workers": WORKERS // 2}) as svc:
        yield svc


def test_a_tenant_whose_loads_wait_for_room_leaves_threads_to_the_others(service) -> None:
    hog = service.client("evil")
    session = hog.open_session("hog")
    n = HBM_PAGES + WORKERS
    keys = session.store_pages([kv_page(i, "evidence", identity("evil", "hog", 128 * i))
                                for i in range(n)])
    pinned = keys[n - HBM_PAGES:]
    session.prepare_load(pinned)  # the resident pages, the whole HBM: pinned
    returned: list[float] = []
    lock = threading.Lock()

    def wait_for_room(key: bytes) -> None:
        with service.client("evil") as client:
            try:
                client.call("prepare_load", {"session": "hog", "keys": [key]})
            except Exception:  # noqa: BLE001, S110 - busy at the deadline is an answer too
                pass
        with lock:
            returned.append(time.monotonic())

    waiting = [threading.Thread(target=wait_for_room, args=(k,)) for k in keys[:WORKERS]]
    for t in waiting:
        t.start()
    time.sleep(1.0)  # every one of them sent, and waiting for room
    bob = service.client("bob")  # another tenant: served while they wait
    other = bob.open_session("victim")  # (its arrival may cut evil's fair share of pins,
    bob_served = time.monotonic()       # which then frees room: timed before that matters)
    session.release(pinned)  # (not a waiting call: it runs beside the loads it frees)
    for t in waiting:
        t.join(60.0)
    other.store_pages([kv_page(0, "evidence", identity("bob", "victim", 0))])
    other.close()
    bob.close()
    hog.close()
    assert len(returned) == WORKERS
    assert bob_served < min(returned), "bob was served only after the waiting loads returned"


class _GatedLookups:
    """The service's backend, with evil's ``lookup_prefix`` held until ``gate`` opens;
    counts how many of them are inside at once."""

    def __init__(self, inner: object) -> None:
        self.inner, self.gate = inner, threading.Event()
        self.inside = self.peak = 0
        self._lock = threading.Lock()

    def lookup_prefix(self, principal, session, identities):
        if principal.tenant == "evil":
            with self._lock:
                self.inside += 1
                self.peak = max(self.peak, self.inside)
            try:
                self.gate.wait(60.0)
            finally:
                with self._lock:
                    self.inside -= 1
        return self.inner.lookup_prefix(principal, session, identities)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_tenants_slow_calls_of_any_kind_stay_within_its_share(service) -> None:
    """Only stores and loads were held to the share: a tenant's flood of slow lookups
    (4,096 identities each) held every thread, and another tenant's open_session took
    7.7 s. Here evil's lookups block; at most its share of them holds a thread."""
    server = service.server
    gated = _GatedLookups(server.backend)
    server.backend = gated
    try:
        with service.client("evil") as opener:
            opener.open_session("flood").close()
        clients = [service.client("evil") for _ in range(WORKERS)]
        threads = [threading.Thread(target=c.call, args=("lookup_prefix",
                                                         {"session": "flood", "identities": []}))
                   for c in clients]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30.0
        while gated.inside < WORKERS // 2:  # its share of the threads, all held
            assert time.monotonic() < deadline, "evil's lookups never reached the backend"
            time.sleep(0.05)
        served = threading.Event()

        def bob() -> None:
            with service.client("bob") as b:
                b.open_session("victim").close()
            served.set()

        threading.Thread(target=bob, daemon=True).start()
        bob_first = served.wait(30.0)  # while every one of evil's lookups is still held
        gated.gate.set()
        for t in threads:
            t.join(60.0)
        for c in clients:
            c.close()
        assert bob_first, "bob waited behind evil's lookups"
        assert gated.peak == WORKERS // 2
    finally:
        gated.gate.set()
        server.backend = gated.inner
