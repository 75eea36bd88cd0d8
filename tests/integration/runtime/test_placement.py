"""Pool actors go only to nodes advertising ``akv_pool``; HBM actors to hbm_slot/GPU nodes.

A real two-node Ray cluster: the head offers ``hbm_slot`` only (like a GPU worker with
a small /dev/shm), the worker offers ``akv_pool`` (the pool StatefulSet's pods).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime import node_roles, wiring
from agentkv_cluster.runtime.handles import ActorGone, ActorHandle, ActorSlow
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.ray_cluster import ray_cluster

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration

SMALL = {"num_cpus": 1, "object_store_memory": 128 << 20}


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster({**SMALL, "resources": {"akv_pool": 1}},
                     head={**SMALL, "resources": {"hbm_slot": 1}}) as c:
        yield c, next(n.node_id for n in c.list_all_nodes() if not n.head)


def test_pool_nodes_fall_back_to_every_node_when_none_is_marked() -> None:
    plain = [{"NodeID": "a", "Resources": {"CPU": 1}}, {"NodeID": "b", "Resources": {"GPU": 1}}]
    assert [n["NodeID"] for n in node_roles.pool_nodes(plain)] == ["a", "b"]
    marked = [*plain, {"NodeID": "c", "Resources": {"akv_pool": 1}}]
    assert [n["NodeID"] for n in node_roles.pool_nodes(marked)] == ["c"]
    # Nodes joining a cluster that has pool nodes get a pool only when marked themselves.
    assert node_roles.pool_nodes(plain, cluster=marked) == []
    assert [n["NodeID"] for n in node_roles.pool_nodes(plain, cluster=plain)] == ["a", "b"]


def test_nodes_are_named_by_unique_host_names_else_numbered() -> None:
    def node(nid: str, host: str) -> dict:
        return {"NodeID": nid, "NodeManagerHostname": host, "Resources": {}}

    k8s = [node("a", "agentkv-pool-0.agentkv-pool.ns.svc"), node("b", "agentkv-pool-1"),
           node("c", "gpu-worker-x7k2p")]
    assert [node_roles.stable_name(n, k8s) for n in k8s] == [
        "agentkv-pool-0", "agentkv-pool-1", "gpu-worker-x7k2p"]
    one_host = [node("a", "vm"), node("b", "vm")]  # Ray nodes sharing a machine
    assert [node_roles.stable_name(n, one_host) for n in one_host] == [None, None]
    for bad in ("Bad_Host!", "node3"):
        assert node_roles.stable_name(node("d", bad), [node("d", bad), k8s[0]]) is None
    assert node_roles.stable_name(k8s[0], k8s[:1]) is None  # one node: node0 is stable already

    topo = wiring.Topology(controller=None, directory=None)
    cluster = [*k8s, node("v", "vm")]
    for n in cluster:
        topo.node_names[n["NodeID"]] = node_roles.name_node(topo.node_names, n, cluster)
    assert list(topo.node_names.values()) == [
        "agentkv-pool-0", "agentkv-pool-1", "gpu-worker-x7k2p", "vm"]
    # The pod behind "agentkv-pool-1" comes back as a new Ray node: while the old one is
    # alive it gets a number, once that one is gone it takes the name over.
    back = node("b2", "agentkv-pool-1")
    assert node_roles.name_node(topo.node_names, back, [*cluster, back]) == "node4"
    assert node_roles.name_node(topo.node_names, back, [k8s[0], k8s[2], cluster[3], back]) == \
        "agentkv-pool-1"


def test_a_join_that_placed_nothing_is_tried_again(monkeypatch) -> None:
    joined = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "vm", "Resources": {}}]
    monkeypatch.setattr(wiring, "_ray", lambda: SimpleNamespace(nodes=lambda: joined))

    def refused(cfg, topo, nodes, cluster):  # e.g. the dead pool's name is held
        for n in nodes:
            topo.node_names[n["NodeID"]] = "node0"
        raise ValueError("actor name akv-pool-node0 is taken")

    monkeypatch.setattr(wiring, "place", refused)
    topo = wiring.Topology(controller=None, directory=None)
    with pytest.raises(ValueError):
        wiring.join_new_nodes(None, topo)
    assert topo.node_names == {}  # not marked placed: the next poll tries it again


def test_a_join_that_failed_half_way_wires_and_announces_what_it_made(monkeypatch) -> None:
    joined = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "vm", "Resources": {}}]
    monkeypatch.setattr(wiring, "_ray", lambda: SimpleNamespace(nodes=lambda: joined))

    def half(cfg, topo, nodes, cluster):  # the pool is made, then its HBM actor is refused
        topo.node_names["a"] = "node9"
        topo.pools["node9"], topo.pool_node["node9"] = peer("node9"), "a"
        raise ValueError("actor name akv-node9-hbm0 is taken")

    met, announced = [], []
    monkeypatch.setattr(wiring, "place", half)
    monkeypatch.setattr(wiring, "introduce", lambda a, b: met.append((a.name, b.name)))
    controller = SimpleNamespace(add_pool=lambda name, handle: announced.append(name),
                                 add_hbm=lambda *args: announced.append(args[0]))
    topo = wiring.Topology(controller=controller, directory=None,
                           hbms={"node0-hbm0": peer("node0-hbm0")})
    with pytest.raises(ValueError, match="is taken"):
        wiring.join_new_nodes(load_config(env={}), topo)
    assert met == [("node0-hbm0", "node9")]  # the new pool met the HBM actor from before
    assert announced == ["node9"]  # and the controller heard of it, once wired
    assert topo.node_names == {"a": "node9"}  # placed: not tried again


def test_a_join_meets_a_slow_hbm_actor_and_skips_only_a_dead_one(monkeypatch) -> None:
    """An HBM actor that does not answer its ping in time (starved, busy) is met by the new
    pool all the same; only one Ray reports dead is skipped. Before, a missed ping counted
    as dead (``ActorSlow`` is an ``ActorGone``): the slow actor never met the new pool, and
    a placed node is never wired again, so its moves to that pool could not find it."""
    joined = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "vm", "Resources": {}}]
    monkeypatch.setattr(wiring, "_ray", lambda: SimpleNamespace(nodes=lambda: joined))

    def placed(cfg, topo, nodes, cluster):
        topo.node_names["a"] = "node9"
        topo.pools["node9"], topo.pool_node["node9"] = peer("node9"), "a"

    met, announced = [], []
    monkeypatch.setattr(wiring, "place", placed)
    monkeypatch.setattr(wiring, "introduce", lambda a, b: met.append((a.name, b.name)))
    controller = SimpleNamespace(add_pool=lambda name, handle: announced.append(name),
                                 add_hbm=lambda *args: announced.append(args[0]))
    hbms = {"node0-hbm0": peer("node0-hbm0", ActorSlow("no answer in 5.0 s")),
            "node0-hbm1": peer("node0-hbm1", ActorGone("RayActorError")),
            "node0-hbm2": peer("node0-hbm2")}
    topo = wiring.Topology(controller=controller, directory=None, hbms=hbms)
    assert wiring.join_new_nodes(load_config(env={}), topo) == ["node9"]
    assert met == [("node0-hbm0", "node9"), ("node0-hbm2", "node9")]
    assert announced == ["node9"]


def test_a_pair_whose_introduction_timed_out_is_met_on_a_later_join(monkeypatch) -> None:
    """An introduction that timed out (``ActorSlow``: a starved actor, a 120 s wait) was
    swallowed like a dead actor's: a placed node is never placed again, so the pair never
    met and every move between the two found no peer. It is now kept and tried again on
    each later poll, until the two meet or one of them is gone."""
    joined = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "vm", "Resources": {}}]
    monkeypatch.setattr(wiring, "_ray", lambda: SimpleNamespace(nodes=lambda: joined))

    def placed(cfg, topo, nodes, cluster):
        topo.node_names["a"] = "node9"
        topo.pools["node9"], topo.pool_node["node9"] = peer("node9"), "a"

    met: list[tuple[str, str]] = []
    answers = {"node0-hbm0": [ActorSlow("no answer in 120 s"), None],
               "node0-hbm1": [ActorSlow("no answer in 120 s"), ActorGone("RayActorError")]}

    def introduce(a, b):
        pending = answers.get(a.name)
        answer = pending.pop(0) if pending else None
        if answer is not None:
            raise answer
        met.append((a.name, b.name))

    monkeypatch.setattr(wiring, "place", placed)
    monkeypatch.setattr(wiring, "introduce", introduce)
    controller = SimpleNamespace(add_pool=lambda name, handle: None,
                                 add_hbm=lambda *args: None)
    hbms = {name: peer(name) for name in ("node0-hbm0", "node0-hbm1", "node0-hbm2")}
    topo = wiring.Topology(controller=controller, directory=None, hbms=hbms)
    assert wiring.join_new_nodes(load_config(env={}), topo) == ["node9"]
    assert met == [("node0-hbm2", "node9")]
    assert [(a.name, b.name) for a, b in topo.unmet] == [("node0-hbm0", "node9"),
                                                         ("node0-hbm1", "node9")]
    assert wiring.join_new_nodes(load_config(env={}), topo) == []  # no new node
    assert len(topo.unmet) == 2  # the join itself does not wait on them again
    wiring.meet_unmet(topo)  # the next poll
    assert met == [("node0-hbm2", "node9"), ("node0-hbm0", "node9")]
    assert topo.unmet == []  # met, or gone (node0-hbm1 died meanwhile)


def test_the_join_poll_meets_unmet_pairs_outside_the_topology_lock(monkeypatch) -> None:
    """Each try of an unmet pair may wait 120 s each way on a starved actor; under the
    topology lock it held up retired-page summaries (the audit loop) and policy swaps."""
    from agentkv_cluster.runtime import service as service_mod

    svc = service_mod.Service.__new__(service_mod.Service)
    svc._stop, svc._topology = threading.Event(), threading.Lock()
    svc.topo, svc.cfg, svc.front, svc.hbm_capacity = wiring.Topology(
        controller=None, directory=None), None, None, None
    seen: list[tuple[str, bool]] = []

    def meet_unmet(topo):
        seen.append(("meet", svc._topology.locked()))

    def join_new_nodes(cfg, topo, front, capacity):
        seen.append(("join", svc._topology.locked()))
        svc._stop.set()
        return []

    monkeypatch.setattr(service_mod, "JOIN_POLL_S", 0.01)
    monkeypatch.setattr(wiring, "meet_unmet", meet_unmet)
    monkeypatch.setattr(wiring, "join_new_nodes", join_new_nodes)
    svc._join_nodes()
    assert seen == [("meet", False), ("join", True)]


class _Pinged:
    def __init__(self, answer: BaseException | None) -> None:
        self.answer = answer

    def ping(self) -> str:
        if self.answer is not None:
            raise self.answer
        return "here"


def peer(name: str, answer: BaseException | None = None) -> ActorHandle:
    """An actor the join pings and introduces: answers, or raises ``answer``."""
    return ActorHandle.local(_Pinged(answer), name)


def test_pool_only_on_akv_pool_node_and_hbm_uses_it(cluster) -> None:
    c, pool_node_id = cluster
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-place-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "ray": {"address": c.address},
        "hbm": {"page_bytes": 1 << 17, "num_pages": 8},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": 1 << 17, "nvme_dir": str(workdir / "nv")},
    })
    page = 2 * 2 * 2 * 128 * 64 * 2  # kv_page()'s size
    svc = Service(cfg, workdir=workdir, hbm_capacity=2 * page).start()
    try:
        topo = svc.topo
        assert len(topo.pools) == 1, topo.pools
        (pool,) = topo.pools
        assert topo.pool_node[pool] == pool_node_id
        assert topo.pools[pool].node_id() == pool_node_id  # where Ray really placed it
        assert len(topo.hbms) == 1  # one hbm_slot, on the head only
        (hbm,) = topo.hbms
        assert topo.hbm_pool[hbm] == pool
        with svc.client("acme") as client:  # 4 pages, room for 2: two go to the pool node
            s = client.open_session("p1")
            pages = [kv_page(i, "evidence", identity("acme", "p1", 1000 * i)) for i in range(4)]
            keys = s.store_pages(pages)
            prep = s.prepare_load(keys[:1])
            assert prep["pages"][0]["source"] in ("host", "nvme")  # back from the pool node
            done = s.complete_load(prep["load_id"])
            assert done["pages"][0]["data"] == pages[0]["data"]
    finally:
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
