"""``/readyz`` and ``/metrics`` of a running service (local mode) when parts misbehave: a
stop underway, hung actors (a local actor's method held on an event, as a hung Ray actor
holds its call), and tenant labels that could be taken for the overflow bucket."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import OTHER
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.metrics_feed import SCRAPE_DEADLINE_S
from agentkv_cluster.runtime.readiness import READY_DEADLINE_S
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 128 KiB
HANG_S = 30.0


def start(workdir: Path, **metrics: Any) -> Service:
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "metrics": {"port": 0, **metrics},
        "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    return Service(cfg, workdir=workdir, hbm_capacity=3 * PAGE).start(local=True,
                                                                       metrics_http=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agentkv-health-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def service(workdir: Path) -> Iterator[Service]:
    svc = start(workdir)
    yield svc
    svc.stop()


def get(svc: Service, path: str, timeout_s: float = 60.0) -> tuple[int, str, float]:
    """Status, body and how long the answer took."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.http.port}{path}",
                                    timeout=timeout_s) as r:
            code, body = r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        code, body = exc.code, exc.read().decode()
    return code, body, time.monotonic() - started


class Hang:
    """Holds the named methods of local actors until released (at most ``HANG_S``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch, self.release = monkeypatch, threading.Event()

    def __call__(self, actor: object, method: str) -> None:
        real = getattr(actor, method)

        def held(*args: Any) -> Any:
            self.release.wait(HANG_S)
            return real(*args)

        self.monkeypatch.setattr(actor, method, held)


@pytest.fixture
def hang(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hang]:
    h = Hang(monkeypatch)
    yield h
    h.release.set()  # before the service stops: its shutdown calls the same actors


def part_ok(text: str) -> dict[str, float]:
    return {s.labels["part"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_scrape_part_ok"}


def test_readiness_says_stopping_from_the_moment_stop_begins(service, monkeypatch) -> None:
    assert get(service, "/readyz")[:2] == (200, "ready\ncontroller ok\ndirectory ok\n")
    # Stop begins while an erasure made by another process is being enforced (a pool slow
    # to purge): stop waits for that before it closes the endpoints.
    entered, finish = threading.Event(), threading.Event()

    def enforcing() -> list[str]:
        entered.set()
        finish.wait(HANG_S)
        return []

    monkeypatch.setattr(service.erasure, "enforce_new_marks", enforcing)
    assert entered.wait(10.0)  # the watcher looks every second
    stopping = threading.Thread(target=service.stop)
    stopping.start()
    try:
        for _ in range(3):
            code, body, _ = get(service, "/readyz")
            assert (code, body) == (503, "not ready: stopping\n")
    finally:
        finish.set()
        stopping.join(60.0)


def test_readiness_answers_within_its_deadline_while_the_controller_hangs(service,
                                                                           hang) -> None:
    hang(service.topo.controller.target, "ping")
    for _ in range(3):  # each probe, while the same ping is still held
        code, body, took = get(service, "/readyz")
        assert took < READY_DEADLINE_S + 2.0  # not the 30 s the controller hangs
        late = f"controller: no answer within {READY_DEADLINE_S:g} s"
        assert (code, body) == (503, f"not ready: controller\n{late}\ndirectory ok\n")
    hang.release.set()
    deadline = time.monotonic() + 10.0
    while get(service, "/readyz")[0] != 200:
        assert time.monotonic() < deadline


def test_a_scrape_with_hung_actors_answers_within_one_deadline(service, hang) -> None:
    assert part_ok(get(service, "/metrics")[1]) == {"controller": 1, "pool/node0": 1}
    hang(service.topo.controller.target, "metrics_since")
    for pool in service.topo.pools.values():
        hang(pool.target, "stats")
    for _ in range(2):
        code, text, took = get(service, "/metrics")
        assert took < SCRAPE_DEADLINE_S + 2.0  # not 30 s for each hung part in turn
        assert code == 200 and part_ok(text) == {"controller": 0, "pool/node0": 0}
        assert "process_resident_memory_bytes" in text  # the rest of the exposition is there
    hang.release.set()
    assert part_ok(get(service, "/metrics")[1]) == {"controller": 1, "pool/node0": 1}


def test_a_tenant_called_other_keeps_its_own_series(workdir) -> None:
    svc = start(workdir, top_tenants=2, tenant_names=True)
    try:
        for tenant in ("acme", "other", "zeta", "yeti"):
            with svc.client(tenant) as client:
                s = client.open_session("s")
                keys = s.store_pages([kv_page(0, "evidence", identity(tenant, "s", 0))])
                s.load(keys)
                s.release(keys)
        text = get(svc, "/metrics")[1]
    finally:
        svc.stop()
    restores = {s.labels["tenant"]: s.value for fam in text_string_to_metric_families(text)
                for s in fam.samples if s.name == "agentkv_restore_delay_seconds_count"}
    assert restores == {"acme": 1, "other": 1, OTHER: 2}  # zeta and yeti overflow


def test_once_stopping_has_begun_readiness_fails_while_requests_are_still_served(
        service) -> None:
    service.begin_stop()
    assert get(service, "/readyz")[:2] == (503, "not ready: stopping\n")
    with service.client("acme") as client:  # connections still open are served to the end
        s = client.open_session("late")
        assert len(s.store_pages([kv_page(0, "evidence", identity("acme", "late", 0))])) == 1
