"""One tenant's loads that wait for room must not hold every API worker thread: a tenant
pinned its whole HBM share and sent as many loads as there are workers, each waiting for
room (up to 45 s), and every other tenant's calls, ``open_session`` included, waited
behind them. Now one tenant's calls that can wait hold at most ``api.tenant_workers``
threads; the rest of its calls wait for a turn without one."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry
WORKERS = 8
HBM_PAGES = 16


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-share-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0, "workers": WORKERS, "tenant_workers": WORKERS // 2},
        "hbm": {"page_bytes": PAGE, "num_pages": HBM_PAGES},
        "pool": {"pool_bytes": 64 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


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
