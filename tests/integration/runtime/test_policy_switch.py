"""``Service.use_policy`` on a real Ray cluster: what AgentKV learned online (its reuse
predictor: tool-duration laws, eq. 2 weights, calibration) crosses Ray to the next AgentKV
controller, which keeps learning on it; an LRU controller in between learns nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.ray_cluster import NODE, ray_cluster

pytest.importorskip("ray")

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-switch-"))
    with ray_cluster(head=NODE) as cluster:
        cfg = load_config(env={}, overrides={
            "api": {"port": 0}, "ray": {"address": cluster.address},
            "hbm": {"page_bytes": PAGE, "num_pages": 16},
            "pool": {"pool_bytes": 16 * PAGE, "slot_bytes": PAGE,
                     "nvme_dir": str(workdir / "nv")},
        })
        svc = Service(cfg, workdir=workdir, policy="agentkv", hbm_capacity=3 * PAGE).start()
        yield svc
        svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _episode(svc: Service, session: str) -> None:
    """Four pages in an HBM budget of three, a tool call of class "grep", then the resume
    of two of them (the first: pushed out to the pool)."""
    with svc.client("acme") as client:
        s = client.open_session(session)
        keys = s.store_pages([kv_page(i, "evidence", identity("acme", session, 1000 * i))
                              for i in range(4)])
        version = iter(range(1, 100))

        def event(kind: str, **fields: object) -> None:
            v = next(version)
            s.event(kind, event_id=v, task_id="x", version=v, ts=time.time(), **fields)

        event("task_start", prefix_generation=1, prefix_pages=[0], input_pages=[1, 2, 3])
        event("model_call", call_id="m0", consumes=[0, 1, 2, 3], produces=[])
        event("tool_start", call_id="k0", tool="grep")
        time.sleep(0.3)
        event("observation_return", call_id="k0", produces=[])
        prep = s.prepare_load(keys[:2])
        s.complete_load(prep["load_id"])
        s.release(keys[:2])
        event("task_end")


def _learned(svc: Service):
    assert svc.topo is not None
    return svc.topo.controller.learned()


def test_what_agentkv_learned_crosses_ray_to_its_next_controller(service) -> None:
    _episode(service, "first")
    learned = _learned(service)
    assert learned.policy == "agentkv"
    seen = learned.predictor.tools.distribution("grep").n
    outcomes = len(learned.predictor.calibration)
    assert seen == 1 and outcomes > 0  # the tool returned; its pages' reuse was observed

    service.use_policy("lru")
    assert _learned(service) is None  # LRU learns nothing
    _episode(service, "under-lru")

    service.use_policy("agentkv")
    carried = _learned(service)
    assert carried.predictor.tools.distribution("grep").n == seen  # not LRU's episode
    assert len(carried.predictor.calibration) == outcomes
    assert carried.predictor.reuse.w.tolist() == learned.predictor.reuse.w.tolist()

    _episode(service, "second")  # it keeps learning on what crossed Ray (writable arrays)
    after = _learned(service)
    assert after.predictor.tools.distribution("grep").n == seen + 1
    assert len(after.predictor.calibration) > outcomes
    stats = service.stats()
    assert not stats["errors"], stats["errors"]
