"""A session closed while a move of its pages is in flight leaves nothing behind (service
in local mode: every actor in this process, real NIXL, /dev/shm, files and AES-GCM).

Closing retires the session's pages at once: their deletions run in the background while
the moves still run. Before, a demotion that wrote its pool copies after the deletion
looked for them left those copies in the pool and its directory for good (a later lookup
of the same identities found them), and an ingest that landed after the deletion left its
arena page held by nothing. The pool and the HBM actor are slowed down so that the close
falls inside the move, every time; the churn at the end needs no such help (before, it
left 6-18 copies in the pool over 320 closes)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def _slowed(monkeypatch, target: object, name: str) -> threading.Event:
    """``target.name`` starts 1 s late; the event is set when the first call begins."""
    began = threading.Event()
    real: Callable = getattr(target, name)

    def late(*args, **kwargs):
        began.set()
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, late)
    return began


def _settled(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pages(n: int, first: int = 0) -> list[dict]:
    return [kv_page(i, "evidence", identity("acme", "r1", 1000 * i))
            for i in range(first, first + n)]


@pytest.fixture
def service():
    with local_service("agentkv-retire-moving-", page_bytes=PAGE, hbm_pages=2,
                       pool_bytes=8 * PAGE, hbm_capacity=2 * PAGE) as svc:
        yield svc


def test_copies_a_demotion_writes_after_the_close_are_deleted(service, monkeypatch) -> None:
    pool = service.topo.pools["node0"].target
    hbm = service.topo.hbms["node0-hbm0"].target
    client = service.client("acme")
    session = client.open_session("r1")
    session.store_pages(_pages(2))  # the HBM is full
    began = _slowed(monkeypatch, pool, "store_from")
    stored: list[object] = []

    def store_two_more() -> None:  # they push the first two out to the pool
        try:
            stored.append(service.client("acme").open_session("r1").store_pages(_pages(2, 2)))
        except Exception as exc:  # noqa: BLE001 - how the store ended, for the assertion
            stored.append(exc)

    thread = threading.Thread(target=store_two_more)
    thread.start()
    assert began.wait(10.0)
    assert session.close()["retired"] == 4  # while the first demotion is in the pool's hands
    thread.join()
    assert "closed during this store" in str(stored[0])  # not "the tenant was erased"
    assert _settled(lambda: pool.stats()["copies"] == 0), pool.stats()
    fresh = service.client("acme").open_session("r2")
    assert fresh.lookup_prefix([p["identity"] for p in _pages(4)])["length"] == 0
    assert hbm.keys() == []


@pytest.mark.parametrize("reopen", [False, True])
def test_an_arena_page_an_ingest_lands_after_the_close_is_freed(service, monkeypatch,
                                                                reopen: bool) -> None:
    hbm = service.topo.hbms["node0-hbm0"].target
    client = service.client("acme")
    session = client.open_session("r1")
    began = _slowed(monkeypatch, hbm, "ingest")
    stored: list[object] = []

    def store_one() -> None:
        try:
            stored.append(service.client("acme").open_session("r1").store_pages(_pages(1)))
        except RemoteError as exc:
            stored.append(exc)

    thread = threading.Thread(target=store_one)
    thread.start()
    assert began.wait(10.0)
    assert session.close()["retired"] == 1  # while the HBM actor pulls the page's bytes
    if reopen:  # a new session of the same name is not the one the store began in
        client.open_session("r1")
    thread.join()
    # The store is refused (it answered with the key of a page retired under it).
    assert isinstance(stored[0], RemoteError) and "closed during this store" in str(stored[0])
    assert _settled(lambda: hbm.keys() == []), hbm.pages.counts()
    assert hbm.stats()["pages"] == 0


def _churn(service, worker: int, rounds: int, refused: list[str]) -> None:
    """One client's sessions: store a few pages (more than the HBM holds, so stores push
    pages out), load some, close, half the time from another thread while moves run."""
    rng = random.Random(worker)
    tenant = ("acme", "globex")[worker % 2]
    closers = []
    with service.client(tenant) as client:
        for r in range(rounds):
            name = f"w{worker}-{r % 3}"
            session = client.open_session(name)
            try:
                pages = [kv_page(rng.randint(0, 1 << 20), "evidence",
                                 identity(tenant, name, 1000 * i))
                         for i in rng.sample(range(12), rng.randint(1, 4))]
                keys = session.store_pages(pages)
                if rng.random() < 0.7:
                    session.load(keys[:rng.randint(1, min(2, len(keys)))])  # HBM: 2 pages
            except RemoteError as exc:  # a close from an earlier round got there first
                refused.append(exc.code)
            if rng.random() < 0.5:
                closers.append(threading.Thread(target=session.close))
                closers[-1].start()
            else:
                session.close()
        for closer in closers:
            closer.join()


def test_sessions_that_close_while_their_pages_move_leave_nothing_behind(service) -> None:
    hbm = service.topo.hbms["node0-hbm0"].target
    pool = service.topo.pools["node0"].target
    refused: list[str] = []
    workers = [threading.Thread(target=_churn, args=(service, w, 60, refused))
               for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert set(refused) <= {"not_found"}, refused
    assert _settled(lambda: hbm.keys() == [] and pool.stats()["copies"] == 0), \
        (hbm.pages.counts(), pool.stats())
    assert not service.topo.controller.target.controller.manager.events.retired_moving
