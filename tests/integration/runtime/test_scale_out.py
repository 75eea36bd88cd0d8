"""A Ray node that joins after ``agentkv serve`` started (a GPU worker scaled up) gets its
own HBM actor, wired to the pools and the front, and serves sessions byte-identically.
Real two-then-three-node Ray cluster on one machine, real NIXL, embedded directory."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import pytest

from agentkv_cluster.config import AgentKvConfig, load_config
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import Episode, identity, kv_page
from tests.support.ray_cluster import NODE, ray_cluster

pytest.importorskip("ray")
pytestmark = pytest.mark.integration


@pytest.fixture
def cluster():
    with ray_cluster(NODE) as c:
        yield c


def joinable(cluster) -> tuple[Path, AgentKvConfig]:
    """A fresh work folder and a small service config on ``cluster``."""
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-join-"))
    return workdir, load_config(env={}, overrides={
        "api": {"port": 0}, "ray": {"address": cluster.address},
        "hbm": {"page_bytes": 1 << 17, "num_pages": 16},
        "pool": {"pool_bytes": 8 << 20, "slot_bytes": 1 << 17, "nvme_dir": str(workdir / "nv")},
    })


def test_a_node_that_joins_later_gets_an_hbm_actor_that_serves(cluster, caplog):
    workdir, cfg = joinable(cluster)
    svc = Service(cfg, workdir=workdir, policy="agentkv").start()
    try:
        assert sorted(svc.topo.hbms) == ["node0-hbm0", "node1-hbm0"]
        first = Episode(svc, "acme", "before")  # the first two actors each get a session
        second = Episode(svc, "acme", "before-2")
        cluster.add_node(**NODE)
        # The service places the actor in its topology, then tells the controller (one
        # more actor call): wait for both.
        deadline = time.monotonic() + 180  # Ray workers start (torch, NIXL) on a busy box
        while time.monotonic() < deadline and (
                "node2-hbm0" not in svc.topo.hbms
                or "node2-hbm0" not in svc.topo.controller.topology()["hbms"]):
            time.sleep(0.5)
        assert sorted(svc.topo.hbms) == ["node0-hbm0", "node1-hbm0", "node2-hbm0"]
        assert svc.topo.controller.topology()["hbms"] == sorted(svc.topo.hbms)
        # The controller hears of the actor only once it is wired: the front has met it.
        assert svc.front.mover.knows(svc.topo.hbms["node2-hbm0"].endpoint().agent)
        assert "node2" in svc.topo.pools  # no node advertises akv_pool: every node has one
        joined = Episode(svc, "acme", "after")  # the least loaded actor: the new one
        placed = joined.s.client.call("open_session", {"session": joined.session})["hbm"]
        assert placed == "node2-hbm0"
        pages = [kv_page(i, "evidence", identity("acme", "after", 128 * i)) for i in range(3)]
        joined.store(*pages)
        _, done = joined.load([0, 1, 2])
        assert [p["data"] for p in done] == [p["data"] for p in pages]
        for ep in (first, second, joined):
            ep.client.close()
        # A node dies (its pool with it) and another joins: the newcomer is wired to the
        # live pools only, and serves.
        cluster.remove_node(next(n for n in cluster.list_all_nodes() if not n.head))
        cluster.add_node(**NODE)
        deadline = time.monotonic() + 180  # Ray workers start (torch, NIXL) on a busy box
        while "node3-hbm0" not in svc.topo.controller.topology()["hbms"] \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "node3-hbm0" in svc.topo.hbms and "node3" in svc.topo.pools
        assert "node3" in svc.topo.controller.topology()["pools"]
        later = Episode(svc, "acme", "later")
        later.s.client.call("open_session", {"session": later.session})
        pages = [kv_page(i, "evidence", identity("acme", "later", 128 * i)) for i in range(2)]
        later.store(*pages)
        assert [p["data"] for p in later.load([0, 1])[1]] == [p["data"] for p in pages]
        later.client.close()
        failed = [r for r in caplog.records if "joined nodes failed" in r.getMessage()]
        assert failed == []  # every join wired its actors completely, dead ones skipped
    finally:
        svc.stop()


def test_an_actor_whose_node_dies_while_it_is_wired_is_skipped(cluster, caplog, monkeypatch):
    """The new node's HBM actor dies between meeting the pools and meeting the front (its
    node left mid-join): the join still finishes (the new pool is wired and announced),
    the controller's watcher forgets the dead actor, and sessions keep being served."""
    workdir, cfg = joinable(cluster)
    caplog.set_level(logging.INFO, logger="agentkv_cluster.runtime.service")
    svc = Service(cfg, workdir=workdir, policy="agentkv").start()
    introduce = wiring.introduce

    def dies_before_the_front(a, b):
        if b is svc.front and getattr(a, "name", "") == "node2-hbm0":
            a.kill()
        introduce(a, b)

    monkeypatch.setattr(wiring, "introduce", dies_before_the_front)
    try:
        cluster.add_node(**NODE)
        deadline = time.monotonic() + 180  # Ray workers start (torch, NIXL) on a busy box
        while time.monotonic() < deadline and not any(
                "placed actors on joined nodes" in r.getMessage() for r in caplog.records):
            time.sleep(0.5)
        placed = [r.getMessage() for r in caplog.records if "placed actors" in r.getMessage()]
        assert placed == ["placed actors on joined nodes: node2, node2-hbm0"]
        assert "node2" in svc.topo.controller.topology()["pools"]
        while time.monotonic() < deadline and \
                "node2-hbm0" in svc.topo.controller.topology()["hbms"]:
            time.sleep(0.5)
        assert svc.topo.controller.topology()["hbms"] == ["node0-hbm0", "node1-hbm0"]
        ep = Episode(svc, "acme", "after")
        hbm = ep.s.client.call("open_session", {"session": ep.session})["hbm"]
        assert hbm in ("node0-hbm0", "node1-hbm0")
        pages = [kv_page(i, "evidence", identity("acme", "after", 128 * i)) for i in range(2)]
        ep.store(*pages)
        assert [p["data"] for p in ep.load([0, 1])[1]] == [p["data"] for p in pages]
        ep.client.close()
        assert not [r for r in caplog.records if "joined nodes failed" in r.getMessage()]
    finally:
        svc.stop()
