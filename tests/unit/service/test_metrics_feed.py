"""The scrape-time feed that turns the actors' cumulative figures into counters: a policy
swap (a new controller) restarts the controller's figures but not the pools' own, what it
remembers is bounded like the tenant labels, and hung actors cost a scrape one deadline."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.metrics import OTHER, ServiceMetrics
from agentkv_cluster.runtime.metrics_feed import MetricsFeed
from agentkv_cluster.runtime.records import RETIRED_TENANT


class Controller:
    def __init__(self) -> None:
        self.gave_room = 0

    def options(self, **_: Any) -> Controller:
        return self

    def metrics_since(self, cursor: int) -> SimpleNamespace:
        return SimpleNamespace(cursor=cursor, waits=[], phases=[], hbm_used=0, recompute={},
                               traffic={}, codecs={}, gave_room=self.gave_room)


class Pool:
    def __init__(self, name: str = "node0") -> None:
        self.name, self.rejects = name, 0
        self.nvme_full = self.refused_full = 0
        self.reserve = self.reserve_target = 256 << 10

    def options(self, **_: Any) -> Pool:
        return self

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "host_used_bytes": 0, "nvme_live_bytes": 0,
                "rejects": self.rejects, "nvme_full": self.nvme_full,
                "refused_full": self.refused_full, "nvme_reserve_bytes": self.reserve,
                "nvme_reserve_target_bytes": self.reserve_target}


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


def full_stores(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["outcome"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_nvme_full_stores_total"}


def test_a_pools_nvme_full_stores_are_counted_once_by_outcome_across_a_policy_swap() -> None:
    pool, metrics = Pool(), ServiceMetrics()
    feed, service = feed_for(metrics, Controller(), {"node0": pool})
    pool.nvme_full, pool.refused_full = 5, 2  # 3 spilled into host slots, 2 refused
    feed()
    assert full_stores(metrics) == {"spilled": 3, "refused": 2}
    service.topo.controller = Controller()  # Service.use_policy: the pool's counts stay
    feed()
    assert full_stores(metrics) == {"spilled": 3, "refused": 2}
    pool.nvme_full = 6
    feed()
    assert full_stores(metrics) == {"spilled": 4, "refused": 2}


def feed_for(metrics: ServiceMetrics, controller: Any, pools: dict[str, Any] | None = None,
             **kwargs: Any) -> tuple[MetricsFeed, SimpleNamespace]:
    cfg = SimpleNamespace(pool=SimpleNamespace(pool_bytes=1, nvme_bytes=1),
                          hbm=SimpleNamespace(page_bytes=1, num_pages=1))
    service = SimpleNamespace(metrics=metrics, cfg=cfg, hbm_capacity=None, topo=SimpleNamespace(
        controller=controller, pools=pools or {}, hbms={}))
    return MetricsFeed(service, **kwargs), service  # type: ignore[arg-type]


class Traffic(Controller):
    """A controller that reports cumulative bytes per (tenant, tier), as the real one does."""

    def __init__(self) -> None:
        super().__init__()
        self.traffic: dict[tuple[str, str], int] = {}

    def metrics_since(self, cursor: int) -> SimpleNamespace:
        got = super().metrics_since(cursor)
        got.traffic = dict(self.traffic)
        return got


def bytes_by_tenant(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["tenant"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_transfer_bytes_total"}


def test_the_exported_record_is_bounded_by_the_labels_not_by_the_tenants() -> None:
    metrics, controller = ServiceMetrics(top_tenants=3, tenant_names=True), Traffic()
    feed, _ = feed_for(metrics, controller)
    controller.traffic = {(f"t{i:03}", "host"): 10 for i in range(300)}
    feed()
    bound = len(feed.exported)
    assert bound <= 3 + 1 + 1  # three tenants, the overflow bucket, gave_room
    controller.traffic = {(f"t{i:03}", "host"): 15 for i in range(600)}  # 300 more tenants
    feed()
    assert len(feed.exported) == bound
    assert bytes_by_tenant(metrics) == {"t000": 15, "t001": 15, "t002": 15, OTHER: 597 * 15}


def test_an_erased_tenants_later_bytes_count_once_under_the_overflow_label() -> None:
    metrics, controller = ServiceMetrics(top_tenants=2, tenant_names=True), Traffic()
    feed, _ = feed_for(metrics, controller)
    controller.traffic = {("a", "nvme"): 100, ("b", "nvme"): 10, ("c", "nvme"): 1}
    feed()
    metrics.erased("a", failed=False)  # its series go; the controller still counts it
    controller.traffic = {("a", "nvme"): 102, ("b", "nvme"): 10, ("c", "nvme"): 4}
    feed()
    assert bytes_by_tenant(metrics) == {"b": 10, OTHER: 1 + 3 + 2}  # not a's 100 again


def test_a_retired_tenants_bytes_count_once_and_its_name_leaves_the_record() -> None:
    """On erasure the controller folds the tenant's totals into ``RETIRED_TENANT``'s (it
    kept every tenant ever served, and sent them all on each scrape): what the tenant's
    own label exported is not counted again under the overflow label, what came after is,
    once, and an overflow tenant retired moves nothing."""
    metrics, controller = ServiceMetrics(top_tenants=2, tenant_names=True), Traffic()
    feed, _ = feed_for(metrics, controller)
    controller.traffic = {("a", "nvme"): 100, ("b", "nvme"): 10, ("c", "nvme"): 1}
    feed()
    metrics.erased("a", failed=False)
    controller.traffic = {(RETIRED_TENANT, "nvme"): 102, ("b", "nvme"): 10, ("c", "nvme"): 4}
    feed()
    assert bytes_by_tenant(metrics) == {"b": 10, OTHER: 1 + 3 + 2}
    assert not any("a" in key for key in feed.exported._last)
    controller.traffic = {(RETIRED_TENANT, "nvme"): 102, ("b", "nvme"): 10, ("c", "nvme"): 5}
    feed()
    assert bytes_by_tenant(metrics) == {"b": 10, OTHER: 7}
    controller.traffic = {(RETIRED_TENANT, "nvme"): 107, ("b", "nvme"): 10}  # c retired
    feed()
    assert bytes_by_tenant(metrics) == {"b": 10, OTHER: 7}
    controller.traffic = {(RETIRED_TENANT, "nvme"): 107, ("b", "nvme"): 10, ("a", "nvme"): 3}
    feed()  # a tenant of the erased name again: never named, its bytes under the overflow
    assert bytes_by_tenant(metrics) == {"b": 10, OTHER: 10}


def test_tenants_served_and_erased_by_the_thousand_leave_the_record_as_it_was() -> None:
    metrics, controller = ServiceMetrics(top_tenants=3, tenant_names=True), Traffic()
    feed, _ = feed_for(metrics, controller)
    retired, sizes = 0, set()
    for i in range(1000):
        tenant = f"t{i:04}"
        controller.traffic = {(RETIRED_TENANT, "host"): retired, (tenant, "host"): 5}
        feed()
        metrics.erased(tenant, failed=False)
        retired += 5
        sizes.add(len(feed.exported) + len(feed._absorbed))
    controller.traffic = {(RETIRED_TENANT, "host"): retired}
    feed()
    assert max(sizes) <= 3 + 1 + 1 + 1  # labelled tenants, overflow, gave_room, absorbed
    assert sum(bytes_by_tenant(metrics).values()) == 5 * (1000 - 3)  # the erased labels' go


class Hung:
    """A controller or pool whose calls hang until ``release``; counts the calls made."""

    def __init__(self, inner: Any, method: str) -> None:
        self.inner, self.method, self.calls = inner, method, 0
        self.release = threading.Event()

    def options(self, **_: Any) -> Hung:
        return self

    def __getattr__(self, name: str) -> Any:
        if name != self.method:
            return getattr(self.inner, name)

        def call(*args: Any) -> Any:
            self.calls += 1
            self.release.wait(30.0)
            return getattr(self.inner, name)(*args)

        return call


def part_ok(m: ServiceMetrics) -> dict[str, float]:
    text = m.exposition().decode()
    return {s.labels["part"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "agentkv_scrape_part_ok"}


def test_hung_actors_cost_a_scrape_one_deadline_and_their_late_answer_counts_once() -> None:
    inner, deadline_s = Controller(), 0.3
    inner.gave_room = 5
    controller, pool = Hung(inner, "metrics_since"), Hung(Pool(), "stats")
    metrics = ServiceMetrics()
    feed, _ = feed_for(metrics, controller, {"node0": pool, "node1": Pool("node1")},
                       deadline_s=deadline_s)
    for _ in range(2):  # the second scrape does not ask the hung parts again
        started = time.monotonic()
        feed()
        assert time.monotonic() - started < deadline_s + 2.0  # not 30 s per hung part
        assert part_ok(metrics) == {"controller": 0, "pool/node0": 0, "pool/node1": 1}
        assert counter(metrics, "agentkv_prefetch_gave_room_total") == 0
    assert (controller.calls, pool.calls) == (1, 1)
    controller.release.set()
    pool.release.set()
    for _ in range(2):  # the late answer is taken once, then the parts are asked afresh
        feed()
        assert part_ok(metrics) == {"controller": 1, "pool/node0": 1, "pool/node1": 1}
        assert counter(metrics, "agentkv_prefetch_gave_room_total") == 5
    assert (controller.calls, pool.calls) == (2, 2)


class Failing(Pool):
    """A pool whose next ``stats`` raises ``error`` (then answers again)."""

    def __init__(self, name: str, used: int) -> None:
        super().__init__(name)
        self.used, self.error = used, None

    def stats(self) -> dict[str, Any]:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return {**super().stats(), "host_used_bytes": self.used}


def test_a_pool_that_answered_too_late_keeps_its_occupancy_and_a_dead_one_holds_nothing(
        ) -> None:
    """``ActorSlow`` is an ``ActorGone``: a pool whose answer timed out used to count as
    holding nothing until it answered again, as a dead one does."""
    from agentkv_cluster.runtime.handles import ActorGone, ActorSlow

    metrics = ServiceMetrics()
    slow, dead = Failing("node0", 100), Failing("node1", 20)
    feed, _ = feed_for(metrics, Controller(), {"node0": slow, "node1": dead})

    def host_used() -> float:
        text = metrics.exposition().decode()
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "agentkv_tier_occupancy_bytes" and s.labels["tier"] == "host")

    feed()
    assert host_used() == 120
    slow.error, dead.error = ActorSlow("node0: no answer in 10 s"), ActorGone("RayActorError")
    feed()
    assert part_ok(metrics) == {"controller": 1, "pool/node0": 0, "pool/node1": 0}
    assert host_used() == 100  # the slow one's last figure; the dead one's is gone


def test_each_pools_nvme_reserve_is_a_gauge_and_a_dead_pools_series_go() -> None:
    """A reserve drawn on by a full file system shows below its target, per pool (the alert
    AgentKVNvmeReserveSpent compares the two); a slow pool keeps its last figures, a dead
    pool's series are removed rather than left at their last value."""
    from agentkv_cluster.runtime.handles import ActorGone, ActorSlow

    metrics = ServiceMetrics()
    full, quiet = Failing("node0", 0), Failing("node1", 0)
    feed, _ = feed_for(metrics, Controller(), {"node0": full, "node1": quiet})

    def reserves() -> dict[str, tuple[float, float]]:
        text = metrics.exposition().decode()
        got: dict[str, list[float]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in ("agentkv_nvme_reserve_bytes", "agentkv_nvme_reserve_target_bytes"):
                    got.setdefault(s.labels["pool"], [0.0, 0.0])[
                        s.name.endswith("target_bytes")] = s.value
        return {pool: (held, target) for pool, (held, target) in got.items()}

    feed()
    assert reserves() == {"node0": (256 << 10, 256 << 10), "node1": (256 << 10, 256 << 10)}
    full.reserve = 16 << 10  # a full disk: deletions drew on it
    feed()
    assert reserves()["node0"] == (16 << 10, 256 << 10)
    full.error, quiet.error = ActorSlow("node0: no answer in 10 s"), ActorGone("RayActorError")
    feed()
    assert reserves() == {"node0": (16 << 10, 256 << 10)}


def test_a_replaced_pool_counts_from_zero_and_none_of_its_rejects_is_lost() -> None:
    metrics, old = ServiceMetrics(), Pool()
    feed, service = feed_for(metrics, Controller(), {"node0": old})
    old.rejects, old.nvme_full, old.refused_full = 5, 4, 4
    feed()
    new = Pool()  # the pool pod restarted: a new actor of the same name, counting from 0
    new.rejects, new.nvme_full, new.refused_full = 2, 1, 1
    service.topo.pools["node0"] = new
    feed()
    assert counter(metrics, "agentkv_verification_rejects_total") == 7
    assert full_stores(metrics) == {"spilled": 0, "refused": 5}
    new.rejects = 3
    feed()
    assert counter(metrics, "agentkv_verification_rejects_total") == 8
