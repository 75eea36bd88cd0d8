"""The scrape-time feed that turns the actors' cumulative figures into counters: a policy
swap (a new controller) restarts the controller's figures but not the pools' own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import ServiceMetrics
from agentkv_cluster.runtime.service import MetricsFeed


class Controller:
    def __init__(self) -> None:
        self.gave_room = 0

    def options(self, **_: Any) -> Controller:
        return self

    def metrics_since(self, cursor: int) -> SimpleNamespace:
        return SimpleNamespace(cursor=cursor, waits=[], phases=[], hbm_used=0, recompute={},
                               traffic={}, codecs={}, gave_room=self.gave_room)


class Pool:
    rejects = 0

    def options(self, **_: Any) -> Pool:
        return self

    def stats(self) -> dict[str, Any]:
        return {"name": "node0", "host_used_bytes": 0, "nvme_live_bytes": 0,
                "rejects": self.rejects}


def counter(m: ServiceMetrics, name: str) -> float:
    text = m.exposition().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name)


def test_a_policy_swap_does_not_count_a_pools_rejects_again() -> None:
    pool, metrics = Pool(), ServiceMetrics()
    cfg = SimpleNamespace(pool=SimpleNamespace(pool_bytes=1, nvme_bytes=1),
                          hbm=SimpleNamespace(page_bytes=1, num_pages=1))
    service = SimpleNamespace(metrics=metrics, cfg=cfg, hbm_capacity=None, topo=SimpleNamespace(
        controller=Controller(), pools={"node0": pool}, hbms={}))
    feed = MetricsFeed(service)  # type: ignore[arg-type]
    pool.rejects = 3
    service.topo.controller.gave_room = 2
    feed()
    assert counter(metrics, "agentkv_verification_rejects_total") == 3
    service.topo.controller = Controller()  # Service.use_policy: the pools stay
    service.topo.controller.gave_room = 1  # the new controller counts from 0
    feed()
    assert counter(metrics, "agentkv_verification_rejects_total") == 3  # no new reject
    assert counter(metrics, "agentkv_prefetch_gave_room_total") == 3
    pool.rejects = 4
    feed()
    assert counter(metrics, "agentkv_verification_rejects_total") == 4
