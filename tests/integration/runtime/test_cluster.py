"""The service on a real two-node Ray cluster (one machine), real redis-server, real NIXL.

One module-scoped cluster and service; tests that kill things run last and in order.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.runtime import wiring
from agentkv_cluster.runtime.service import Service
from store.codecs import kv_error
from store.directory.base import DirectoryUnavailable
from tests.support.ray_cluster import NODE, ray_cluster
from tests.support.redis_proc import RedisProcess

pytest.importorskip("ray")

pytestmark = pytest.mark.integration

L, H, D = 2, 2, 64


@pytest.fixture(scope="module")
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(NODE, NODE) as c:
        yield c


@pytest.fixture(scope="module")
def service(cluster, redis):
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-it-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "ray": {"address": cluster.address},
        "directory": {"redis_url": redis.url},
        "hbm": {"page_bytes": 1 << 17, "num_pages": 48},
        "pool": {"pool_bytes": 16 << 20, "slot_bytes": 1 << 17, "nvme_dir": str(workdir / "nv")},
        "credits": {"per_link": 4, "per_session": 1},
    })
    svc = Service(cfg, workdir=workdir, policy="agentkv", hbm_capacity=16 * (1 << 16)).start()
    assert sorted(svc.topo.hbms) == ["node0-hbm0", "node1-hbm0", "node2-hbm0"]
    yield svc
    svc.stop()


def identity(tenant: str, session: str, start: int, tokens: int = 128, model: str = "m1"
             ) -> PageIdentity:
    return PageIdentity(model_version=model, adapter_version="", tokenizer_version="t1",
                        rope_config="theta=1e4", tenant=tenant, session=session, start=start,
                        end=start + tokens, event_version=1)


def kv_page(pid: int, state_type: str, ident: PageIdentity, tokens: int = 128) -> dict:
    rng = np.random.default_rng(pid + 17 * ident.start)
    data = rng.standard_normal(2 * L * H * tokens * D, dtype=np.float32).astype(np.float16)
    return {"page_id": pid, "identity": ident.pack(), "state_type": state_type,
            "data": data.tobytes(), "shape": [L, H, tokens, D]}


def as_kv(data: bytes, tokens: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.frombuffer(bytearray(data), dtype=torch.float16).reshape(2, L, H, tokens, D)
    return x[0], x[1]


class Episode:
    def __init__(self, svc: Service, tenant: str, session: str) -> None:
        self.client = svc.client(tenant)
        self.s = self.client.open_session(session)
        self.tenant, self.session, self.version = tenant, session, 0
        self.pages: dict[int, dict] = {}
        self.keys: dict[int, bytes] = {}

    def ev(self, kind: str, **fields) -> dict:
        self.version += 1
        return self.s.event(kind, event_id=self.version, task_id="t", version=self.version,
                            ts=float(self.version), **fields)

    def store(self, *pages: dict) -> None:
        keys = self.s.store_pages(list(pages))
        for p, k in zip(pages, keys):
            self.pages[p["page_id"]], self.keys[p["page_id"]] = p, k

    def load(self, pids: list[int]) -> tuple[list[dict], list[dict]]:
        keys = [self.keys[p] for p in pids]
        prep = self.s.prepare_load(keys)
        done = self.s.complete_load(prep["load_id"])
        self.s.release(keys)
        return prep["pages"], done["pages"]


def neighbour_on(svc: Service, hbm: str, prefix: str) -> Episode:
    """A new session placed on ``hbm`` (sessions go to the least loaded HBM actor)."""
    for i in range(8):
        ep = Episode(svc, "acme", f"{prefix}-n{i}")
        if ep.s.client.call("open_session", {"session": ep.session})["hbm"] == hbm:
            return ep
        ep.client.close()
    raise AssertionError(f"no session landed on {hbm}")


def test_episode_keeps_pages_through_tool_gap_and_restores_byte_identical(service) -> None:
    ep = Episode(service, "acme", "ep1")
    kinds = {0: "fixed_prefix", 1: "task_input", 2: "evidence", 3: "verified_result",
             4: "temp_reasoning"}
    ep.store(*(kv_page(pid, kind, identity("acme", "ep1", 1000 * pid))
               for pid, kind in kinds.items()))
    ep.ev("task_start", prefix_generation=1, prefix_pages=[0], input_pages=[1])
    ep.ev("model_call", call_id="m1", consumes=[0, 1], produces=[[2, "evidence"],
                                                                 [3, "verified_result"],
                                                                 [4, "temp_reasoning"]])
    ep.ev("tool_start", call_id="k1", tool="pytest")
    hbm = ep.s.client.call("open_session", {"session": "ep1"})["hbm"]
    filler = neighbour_on(service, hbm, "ep1")  # another session on the same HBM actor
    for i in range(14):  # its new pages push ep1's idle pages out during the tool call
        filler.store(kv_page(i, "temp_reasoning", identity("acme", filler.session, 1000 * i)))
    ep.store(kv_page(5, "tool_observation", identity("acme", "ep1", 5000)))
    ep.ev("observation_return", call_id="k1", produces=[[5, "tool_observation"]])
    prep, done = ep.load([0, 1, 2, 3, 4, 5])
    moved = [p for p in prep if p["source"] != "hbm"]
    assert moved, f"the tool gap moved nothing out of {hbm}: {prep}"
    for pid, page in zip([0, 1, 2, 3, 4, 5], done):
        original = ep.pages[pid]["data"]
        if kinds.get(pid) in ("fixed_prefix", "evidence", "verified_result") or page["exact"]:
            assert page["exact"] and page["data"] == original, (pid, [(p["source"], p["codec"], p["exact"]) for p in prep], page["exact"])  # reference kept: exact
        else:  # no reference by policy: a lossy working copy within the codec's bound
            err = kv_error(*as_kv(original), *as_kv(page["data"]))
            assert err.worst < 0.2, (pid, err)
    ep.ev("verification_pass", call_id="v1", pages=[4])
    ep.ev("task_end")
    filler.client.close()
    ep.client.close()


def test_prefix_shared_across_nodes_only_when_compatible_and_same_tenant(service) -> None:
    a = Episode(service, "acme", "share-a")
    hbm_a = a.s.client.call("open_session", {"session": "share-a"})["hbm"]
    prefix = kv_page(0, "fixed_prefix", identity("acme", "", 0))
    a.store(prefix)
    b = Episode(service, "acme", "share-b")
    hbm_b = b.s.client.call("open_session", {"session": "share-b"})["hbm"]
    assert hbm_a != hbm_b  # the two sessions sit on different nodes
    found = b.s.lookup_prefix([identity("acme", "", 0).pack()])
    assert found["length"] == 1 and found["refused"] == ""
    b.keys[0] = found["keys"][0]
    prep, done = b.load([0])
    assert prep[0]["source"] == "remote"  # pulled node to node from A's pool
    assert done[0]["data"] == prefix["data"] and done[0]["exact"]
    # any identity field changed: no match
    assert b.s.lookup_prefix([identity("acme", "", 0, model="m2").pack()])["length"] == 0
    # another tenant: its own namespace has nothing, and it may not name acme's identity
    g = Episode(service, "globex", "share-g")
    assert g.s.lookup_prefix([identity("globex", "", 0).pack()])["length"] == 0
    refused = g.s.lookup_prefix([identity("acme", "", 0).pack()])
    assert refused["length"] == 0 and refused["refused"].startswith("AccessDenied")
    for e in (a, b, g):
        e.client.close()


def test_herd_32_sessions_credits_bound_links_and_nobody_starves(service) -> None:
    results = {}
    for credits in (True, False):
        service.topo.controller.set_credits(credits)
        eps = [Episode(service, "herd", f"h{credits}-{i}") for i in range(32)]
        for ep in eps:  # the herd's pages do not all fit in HBM: restores happen
            ep.store(kv_page(0, "evidence", identity("herd", ep.session, 0)))
        import threading

        delays: list[float] = []
        barrier = threading.Barrier(32)

        def resume(ep: Episode, barrier: threading.Barrier = barrier,
                   delays: list[float] = delays) -> None:
            barrier.wait()  # every tool returns at the same instant
            t0 = time.monotonic()
            _prep, done = ep.load([0])
            assert done[0]["data"] == ep.pages[0]["data"]
            delays.append(time.monotonic() - t0)

        threads = [threading.Thread(target=resume, args=(ep,)) for ep in eps]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        stats = service.stats()
        assert len(delays) == 32  # no session starved
        if credits:
            assert stats["max_in_flight"] and max(stats["max_in_flight"].values()) <= 4
        results[credits] = float(np.percentile(delays, 99))
        for ep in eps:
            ep.client.close()
    print(f"\nherd P99 restore: with credits {results[True] * 1e3:.0f} ms, "
          f"without {results[False] * 1e3:.0f} ms")
    service.topo.controller.set_credits(True)


def test_pool_restart_rebuilds_index_and_redis_loss_is_repopulated(service, redis) -> None:
    ep = Episode(service, "acme", "rec1")
    hbm = ep.s.client.call("open_session", {"session": "rec1"})["hbm"]
    pool = service.topo.hbm_pool[hbm]
    ep.store(kv_page(0, "fixed_prefix", identity("acme", "", 7000)))  # written through
    time.sleep(0.2)
    wiring.restart_pool(service.topo, pool)
    redis.restart()  # an emptied Redis: the shards repopulate it
    assert _republished(service) >= 1
    b = Episode(service, "acme", "rec2")
    found = b.s.lookup_prefix([identity("acme", "", 7000).pack()])
    assert found["length"] == 1
    b.keys[0] = found["keys"][0]
    _, done = b.load([0])
    assert done[0]["data"] == ep.pages[0]["data"]
    ep.client.close()
    b.client.close()


def _republished(service, wait_s: float = 30.0) -> int:
    """Every pool's republish, once the directory answers again: a pool that met the
    restart backs off for a moment (``DirectoryUnavailable``, "next attempt in ...")."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return sum(int(p.republish()) for p in service.topo.pools.values())
        except DirectoryUnavailable:
            assert time.monotonic() < deadline, "the directory did not come back"
            time.sleep(0.2)


def test_killing_hbm_actor_and_node_loses_only_uncopied_pages(service, cluster) -> None:
    ep = Episode(service, "acme", "kill1")
    hbm = ep.s.client.call("open_session", {"session": "kill1"})["hbm"]
    ep.store(kv_page(0, "fixed_prefix", identity("acme", "kill1", 0)),  # pool copy
             kv_page(1, "temp_reasoning", identity("acme", "kill1", 1000)))  # HBM only
    service.topo.hbms[hbm].kill()
    deadline = time.monotonic() + 30
    while hbm in service.topo.controller.topology()["hbms"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    _, done = ep.load([0])
    assert done[0]["data"] == ep.pages[0]["data"]  # restored from its pool copy elsewhere
    with pytest.raises(RemoteError) as info:
        ep.load([1])
    assert "PageLost" in info.value.message  # refused, never a wrong page
    ep.client.close()
    # a whole node goes: pages whose only copies lived there are refused, never wrong
    worker = next(n for n in cluster.list_all_nodes() if not n.head)
    pools_before = len(service.topo.controller.topology()["pools"])
    lost = {h for h, node in service.topo.hbm_node.items() if node == worker.node_id}
    cluster.remove_node(worker)  # which worker goes is Ray's pick: wait until the
    deadline = time.monotonic() + 60  # controller forgot its pool and its HBM actors
    while (len((topo := service.topo.controller.topology())["pools"]) >= pools_before
           or lost & set(topo["hbms"])):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    survivor = Episode(service, "acme", "after-node")
    survivor.store(kv_page(0, "evidence", identity("acme", "after-node", 0)))
    _, done = survivor.load([0])
    assert done[0]["data"] == survivor.pages[0]["data"]
    survivor.client.close()
