"""One tenant cannot starve another on the running service (actors in this process: real
arena, host pool, NVMe shard, NIXL): filling the arena with tiny pages, or pinning every
page with repeated loads, leaves another tenant's stores and loads working."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.controller_actor import ControllerSpec
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 128 KiB
ARENA = 8  # pages the HBM budget holds


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-fair-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": PAGE, "num_pages": ARENA},
        "pool": {"pool_bytes": 64 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _fair_round(svc: Service, session: str) -> float:
    """A well-behaved tenant stores 2 pages and loads them back; returns the seconds."""
    t0 = time.monotonic()
    with svc.client("fair") as client:
        s = client.open_session(session)
        pages = [kv_page(i, "evidence", identity("fair", session, 1000 * i)) for i in range(2)]
        keys = s.store_pages(pages)
        assert s.load(keys) == [p["data"] for p in pages]
        s.release(keys)
    return time.monotonic() - t0


def _controller(svc: Service):
    return svc.topo.controller.target.controller  # local mode: the bookkeeping itself


def test_tiny_pages_fill_the_arena_budget_not_past_it(service) -> None:
    with service.client("greedy") as client:
        s = client.open_session("tiny")
        tiny = [{"identity": identity("greedy", "tiny", 10 * i, tokens=1).pack(),
                 "page_id": i, "data": b"x", "state_type": "evidence"}
                for i in range(6 * ARENA)]
        s.store_pages(tiny)  # each one takes a whole arena page: the rest are demoted
    ctl = _controller(service)
    assert ctl.table.hbms["node0-hbm0"].used <= ARENA * PAGE
    _fair_round(service, "after-tiny")  # no ArenaFull: the tiny pages make room


def test_pinning_everything_neither_blocks_nor_fails_another_tenant(service) -> None:
    calm = _fair_round(service, "calm")  # the same round with nobody pinning
    with service.client("greedy") as client:
        s = client.open_session("pin")
        pages = [kv_page(i, "evidence", identity("greedy", "pin", 1000 * i))
                 for i in range(ARENA)]
        keys = s.store_pages(pages)
        loads = [s.prepare_load(keys)["load_id"] for _ in range(3)]  # never released
        ctl = _controller(service)
        pins = [ctl.table.pages[g].pins for g in ctl.table.resolve("greedy", "pin", keys)]
        assert pins == [1] * ARENA  # three loads of one session: one pin per page

        stressed = _fair_round(service, "stressed")
        print(f"\nanother tenant's store+load: {stressed:.3f} s with every page pinned, "
              f"{calm:.3f} s calm")
        assert stressed < ControllerSpec().pin_timeout_s / 2  # not freed by the timeout
        assert stressed < 20 * calm + 5.0  # nor by any other wait of seconds

        # What the greedy tenant lost is reported as such, not as an internal error.
        try:
            got = s.complete_load(loads[0])["pages"]
            assert [p["data"] for p in got] == [p["data"] for p in pages]
        except RemoteError as exc:
            assert exc.code == "not_found", exc
        s.release(keys)  # one release undoes the three loads
        assert sum(ctl.table.pages[g].pins for g in ctl.table.resolve("greedy", "pin", keys)) == 0
