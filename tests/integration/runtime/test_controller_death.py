"""A dead controller is never replaced (its page table is the service's state), and every
request then failed ``ActorGone`` while ``/healthz`` said ok: the chart's liveness probe
never restarted the pod. ``/healthz`` now answers 503 once the controller is dead; on a
real two-node Ray cluster."""

from __future__ import annotations

import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from tests.support.ray_cluster import NODE, ray_cluster

pytest.importorskip("ray")

pytestmark = pytest.mark.integration


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_fails_once_the_controller_is_dead() -> None:
    with ray_cluster(NODE) as cluster:
        workdir = Path(tempfile.mkdtemp(prefix="agentkv-ctl-death-"))
        cfg = load_config(env={}, overrides={
            "api": {"port": 0}, "metrics": {"port": 0}, "ray": {"address": cluster.address},
            "hbm": {"page_bytes": 1 << 16, "num_pages": 8},
            "pool": {"pool_bytes": 1 << 20, "slot_bytes": 1 << 16,
                     "nvme_dir": str(workdir / "nv")}})
        svc = Service(cfg, workdir=workdir).start(metrics_http=True)
        try:
            port = svc.http.port
            assert _get(port, "/healthz") == (200, "ok\n")
            svc.topo.controller.kill()
            deadline = time.monotonic() + 60.0
            while (health := _get(port, "/healthz"))[0] == 200:
                assert time.monotonic() < deadline, "/healthz still ok with the controller dead"
                time.sleep(0.2)
            gone = "controller gone: this service cannot serve again until it is restarted\n"
            assert health == (503, gone)
            assert _get(port, "/readyz")[0] == 503
        finally:
            svc.stop()
