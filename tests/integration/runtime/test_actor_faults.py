"""Actors that die under a running service, on a real two-node Ray cluster (one machine):
an HBM actor between ``prepare_load`` and ``complete_load``, a pool whose HBM actor lives
on. Clients get typed answers, never wrong bytes, and the service goes on serving.

One module-scoped cluster and service; the tests run in order (each kills something).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.runtime.actor_groups import HEALTH, STOP
from agentkv_cluster.runtime.actor_watch import Liveness, liveness
from agentkv_cluster.runtime.service import Service
from tests.support.ray_cluster import NODE, ray_cluster

pytest.importorskip("ray")

pytestmark = pytest.mark.integration

L, H, D, TOKENS = 2, 2, 64, 128
PAGE = 1 << 17  # one page's bytes (2*L*H*TOKENS*D fp16) and one arena page
BUDGET_PAGES = 8


@pytest.fixture(scope="module")
def service():
    with ray_cluster(NODE) as cluster:
        workdir = Path(tempfile.mkdtemp(prefix="agentkv-faults-"))
        cfg = load_config(env={}, overrides={
            "api": {"port": 0}, "ray": {"address": cluster.address},
            "hbm": {"page_bytes": PAGE, "num_pages": 48},
            "pool": {"pool_bytes": 16 << 20, "slot_bytes": PAGE,
                     "nvme_dir": str(workdir / "nv")},
            "credits": {"per_link": 4, "per_session": 1},
        })
        svc = Service(cfg, workdir=workdir, policy="lru",
                      hbm_capacity=BUDGET_PAGES * PAGE).start()
        assert len(svc.topo.hbms) == 2 and len(svc.topo.pools) == 2
        yield svc
        svc.stop()


def page(pid: int, session: str, state_type: str = "evidence") -> dict:
    ident = PageIdentity(model_version="m1", adapter_version="", tokenizer_version="t1",
                         rope_config="theta=1e4", tenant="acme", session=session,
                         start=1000 * pid, end=1000 * pid + TOKENS, event_version=1)
    data = np.random.default_rng([pid, len(session)]).standard_normal(
        2 * L * H * TOKENS * D, dtype=np.float32).astype(np.float16)
    return {"page_id": pid, "identity": ident.pack(), "state_type": state_type,
            "data": data.tobytes(), "shape": [L, H, TOKENS, D]}


def wait_until(check, what: str, deadline_s: float = 60.0) -> None:
    """A generous deadline only: the watcher forgets a dead actor within a second."""
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def load(s, keys: list[bytes]) -> list[dict]:
    prep = s.prepare_load(keys)
    done = s.complete_load(prep["load_id"])["pages"]
    s.release(keys)
    return done


def test_close_runs_in_its_own_concurrency_group(service) -> None:
    """The controller's ``close`` ends the waits of loads blocked for room; queued behind
    a full set of such calls it would wait for their deadlines itself."""
    from agentkv_cluster.runtime.wiring import ControllerShell

    assert getattr(ControllerShell.close, "__ray_concurrency_group__", None) == STOP
    assert getattr(ControllerShell.ping, "__ray_concurrency_group__", None) == HEALTH


def test_complete_load_after_its_hbm_actor_died_is_not_found_then_never_wrong(service) -> None:
    s = service.client("acme").open_session("h1")
    hbm = s.client.call("open_session", {"session": "h1"})["hbm"]
    pages = [page(0, "h1", "fixed_prefix"),  # written through: a pool copy
             page(1, "h1", "temp_reasoning")]  # HBM only
    keys = s.store_pages(pages)
    prep = s.prepare_load(keys)
    service.topo.hbms[hbm].kill()
    with pytest.raises(RemoteError) as info:
        s.complete_load(prep["load_id"])
    assert info.value.code == "not_found", info.value  # was internal: ActorGone
    assert "prepare the load again" in info.value.message
    s.release(keys)
    wait_until(lambda: hbm not in service.topo.controller.topology()["hbms"],
               "the controller to forget the dead HBM actor")
    (done,) = load(s, keys[:1])  # restored from its pool copy on the HBM actor left
    assert done["exact"] and done["data"] == pages[0]["data"]
    with pytest.raises(RemoteError) as info:
        s.prepare_load(keys[1:])
    assert "PageLost" in info.value.message  # refused, never a wrong page
    s.close()


def test_a_dead_pool_leaves_its_hbm_actor_another_pool_to_demote_into(service) -> None:
    controller = service.topo.controller
    wait_until(lambda: all(liveness(service.topo.hbms[h], 2.0) is Liveness.ALIVE
                           for h in controller.topology()["hbms"]),
               "the controller to forget every dead HBM actor")
    s = service.client("acme").open_session("p1")
    hbm = s.client.call("open_session", {"session": "p1"})["hbm"]
    pool = service.topo.hbm_pool[hbm]  # its HBM actor lives on
    old = [page(i, "p1") for i in range(3 * BUDGET_PAGES)]
    old_keys = s.store_pages(old)  # the first ones were pushed out into `pool`
    service.topo.pools[pool].kill()
    with pytest.raises(RemoteError) as info:  # its only copy died with the pool
        s.prepare_load(old_keys[:1])
    # No copy left, or (the load raced the kill) its restore failed: both are page_lost.
    assert info.value.code == "page_lost", info.value
    assert "no copy left" in info.value.message or "could not be restored" in \
        info.value.message, info.value
    wait_until(lambda: pool not in controller.topology()["pools"],
               "the controller to forget the dead pool")
    new = [page(100 + i, "p1") for i in range(3 * BUDGET_PAGES)]
    new_keys = s.store_pages(new)  # pressure: pages must leave the HBM actor somewhere
    stats = service.stats()
    assert stats["hbm_used"][hbm] <= BUDGET_PAGES * PAGE, stats["hbm_used"]
    assert not [e for e in stats["errors"] if "KeyError" in e], stats["errors"]
    for i in range(0, len(new), 4):  # pushed out into the other pool and back, exact
        done = load(s, new_keys[i:i + 4])
        assert [d["data"] for d in done] == [p["data"] for p in new[i:i + 4]]
    s.close()
