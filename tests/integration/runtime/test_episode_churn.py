"""Agent episodes on a running service, four clients at once under HBM pressure, one
tenant erased half way (service in local mode: every actor in this process, real NIXL,
/dev/shm, files and AES-GCM).

Each episode stores its pages (or looks its tenant's shared prefix up instead), runs a
task through a tool call (gap migrations and prefetches run meanwhile), loads two pages
back, sometimes ends its task, and closes its session, half the time from another thread
while moves still run. Afterwards: every load of a type the risk controller keeps exact
returned the stored bytes, nothing is left in HBM or the pool, the page manager remembers
nothing, and no byte of the erased tenant is left in the arena. A store, load or close of
the erased tenant answers ``tenant_erased`` or ``unauthenticated``; nothing else fails."""

from __future__ import annotations

import random
import threading
import time

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration
KINDS = ["fixed_prefix", "task_input", "evidence", "verified_result", "temp_reasoning"]
EXACT = {"fixed_prefix", "evidence", "verified_result"}  # kept with a FULL reference


class Run:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: list[str] = []
        self.inexact: list[str] = []
        self.marks: list[bytes] = []  # bytes only the erased tenant's pages hold
        self.loads = 0

    def refused(self, exc: Exception) -> None:
        with self.lock:
            self.codes.append(getattr(exc, "code", type(exc).__name__))


def _episode(client, tenant: str, name: str, rng: random.Random, run: Run):
    s = client.open_session(name)
    version = 0

    def event(kind: str, **fields) -> None:
        nonlocal version
        version += 1
        s.event(kind, event_id=version, task_id="t", version=version, ts=float(version),
                **fields)

    shared = kv_page(0, "fixed_prefix", identity(tenant, "shared", 0))
    found = s.lookup_prefix([shared["identity"]]) if rng.random() < 0.6 else {"length": 0}
    pages = [] if found["length"] else [shared]
    own = [kv_page(p, KINDS[p % 5], identity(tenant, name, 1000 * p + rng.randint(0, 99)))
           for p in range(1, rng.randint(2, 5))]
    if tenant == "acme":
        for page in own:
            mark = rng.randbytes(64)
            page["data"] = page["data"][:4096] + mark + page["data"][4160:]
            with run.lock:
                run.marks.append(mark)
    pages += own
    by_id = {p["page_id"]: (p, k) for p, k in zip(pages, s.store_pages(pages))}
    if found["length"]:
        by_id[0] = (shared, found["keys"][0])
    event("task_start", prefix_generation=1, prefix_pages=[0], input_pages=[1])
    event("model_call", call_id="m1", consumes=[0, 1],
          produces=[[p, KINDS[p % 5]] for p in by_id if p > 1])
    event("tool_start", call_id="k1", tool=rng.choice(["pytest", "grep", "curl"]))
    time.sleep(rng.uniform(0.0, 0.6))
    event("observation_return", call_id="k1")
    pids = rng.sample(sorted(by_id), 2)
    for pid, data in zip(pids, s.load([by_id[p][1] for p in pids])):
        page = by_id[pid][0]
        if page["state_type"] in EXACT and data != page["data"]:
            with run.lock:
                run.inexact.append(f"{name}/{pid}")
    with run.lock:
        run.loads += 1
    if rng.random() < 0.5:
        event("task_end")
    return s


def _client(service, worker: int, rounds: int, run: Run) -> None:
    rng = random.Random(worker)
    tenant = ("acme", "globex")[worker % 2]
    closers = []

    def close(s) -> None:
        try:
            s.close()
        except (RemoteError, OSError) as exc:  # the erased tenant's token is void
            run.refused(exc)

    with service.client(tenant) as client:
        for r in range(rounds):
            try:
                s = _episode(client, tenant, f"w{worker}-{r % 3}", rng, run)
            except (RemoteError, OSError) as exc:
                run.refused(exc)
                continue
            if rng.random() < 0.5:
                closers.append(threading.Thread(target=close, args=(s,)))
                closers[-1].start()
            else:
                close(s)
        for closer in closers:
            closer.join()


def test_episodes_closing_and_an_erasure_under_pressure_leave_nothing_behind() -> None:
    with local_service("agentkv-churn-", page_bytes=PAGE, hbm_pages=4, pool_bytes=16 * PAGE,
                       hbm_capacity=4 * PAGE) as service:
        hbm = service.topo.hbms["node0-hbm0"].target
        pool = service.topo.pools["node0"].target
        run = Run()
        clients = [threading.Thread(target=_client, args=(service, w, 10, run))
                   for w in range(4)]
        for c in clients:
            c.start()
        time.sleep(2.0)
        receipt = service.erase_tenant("acme")
        for c in clients:
            c.join()
        assert receipt.failed_tiers == ()
        assert set(run.codes) <= {"tenant_erased", "unauthenticated", "BrokenPipeError",
                                  "ConnectionResetError"}, run.codes
        assert run.loads >= 20 and run.inexact == []
        deadline = time.monotonic() + 20.0
        while (hbm.keys() or pool.stats()["copies"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hbm.keys() == [] and pool.stats()["copies"] == 0, pool.stats()
        manager = service.topo.controller.target.controller.manager
        assert not manager.table.pages and not manager.table.sessions
        assert not manager.events.retired_moving and len(manager.schedule) == 0
        assert run.marks and not any(hbm.arena_holds(run.marks))
