"""The scrape-time feed: figures that live in the actors, pulled into the service's metrics.

On each scrape the controller (credit waits, load phases, HBM in use, cumulative figures per
tenant) and every pool (occupancy, verification rejects) are asked at once, under one
deadline (``SCRAPE_DEADLINE_S``), through a ``PartAsker``: hung actors cannot hold a scrape
longer than that. ``agentkv_scrape_part_ok{part}`` says which part answered; one that did
not keeps its figures from an earlier scrape (its late answer is taken on a later scrape,
once), and a pool that is gone (``ActorGone``) counts as holding nothing (one that only
answered too late, ``ActorSlow``, keeps its last figures).

The controller reports cumulative figures per tenant; counters take increments, so the feed
remembers what it exported. That record is bounded like the labels: one figure per tenant
that has (or had, before an erasure) a label of its own, at most ``top_tenants``, and one
per overflow bucket, the summed figures of every other tenant. An erased tenant's totals
come back folded into ``RETIRED_TENANT``'s, which joins the overflow bucket less what its
own label exported before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentkv_cluster.api.metrics import OTHER
from agentkv_cluster.runtime.handles import ActorGone, ActorSlow
from agentkv_cluster.runtime.part_asker import Answer, Outcome, PartAsker
from agentkv_cluster.runtime.records import RETIRED_TENANT

if TYPE_CHECKING:
    from agentkv_cluster.api.metrics import ServiceMetrics
    from agentkv_cluster.runtime.records import MetricsSince
    from agentkv_cluster.runtime.service import Service

SCRAPE_DEADLINE_S = 2.0  # the whole pull from the actors (Prometheus times a scrape out at 10 s)
ANSWER_TIMEOUT_S = 60.0  # how long an actor call may run on after its scrape gave up on it
CONTROLLER = "controller"
POOL_PART = "pool/"  # + the pool's name


class ExportedFigures:
    """Cumulative figures already exported, to turn the next totals into increments."""

    def __init__(self) -> None:
        self._last: dict[tuple[Any, ...], int] = {}

    def __len__(self) -> int:
        return len(self._last)

    def delta(self, key: tuple[Any, ...], total: int) -> int:
        """The increment since ``key``'s last total (0 when it went down: a restart)."""
        before = self._last.get(key, 0)
        self._last[key] = total
        return max(0, total - before)

    def retain(self, keep: Callable[[tuple[Any, ...]], bool]) -> None:
        """Forget every figure whose key ``keep`` refuses."""
        self.take(lambda key: not keep(key))

    def take(self, select: Callable[[tuple[Any, ...]], bool]) -> list[tuple[tuple[Any, ...], int]]:
        """Forget every figure whose key ``select`` picks; returns them (key, last total)."""
        taken = [(k, v) for k, v in self._last.items() if select(k)]
        for key, _ in taken:
            del self._last[key]
        return taken


POOL_COUNTS = ("rejects", "spilled", "refused")  # a pool's own cumulative counts, by pool


@dataclass(frozen=True, slots=True)
class PoolSeen:
    """What a pool's last answer said: bytes it holds per tier, its NVMe space reserve."""

    name: str
    host: int
    nvme: int
    reserve: tuple[int, int]  # (held, when full)


class MetricsFeed:
    """On each scrape, pulls the figures that live in the actors into the service's metrics:
    credit waits, load phases, per-tier occupancy, recompute tokens, bytes and copies per
    codec written to pool tiers, prefetches that gave their room to a blocked load,
    verification rejects and stores that found a pool's NVMe tier full."""

    def __init__(self, service: Service, deadline_s: float = SCRAPE_DEADLINE_S) -> None:
        self.service = service
        self.deadline_s = deadline_s
        self.exported = ExportedFigures()
        self._asker = PartAsker()
        self._controller: Any = None
        self._cursor = 0
        self._pools: dict[str, PoolSeen] = {}  # pool part -> its last answer's figures
        self._handles: dict[str, Any] = {}  # pool name -> the actor asked last time
        # (kind, what) -> what was exported under labelled tenants since retired: their
        # totals now sit in RETIRED_TENANT's, in the overflow account, and count once.
        self._absorbed: dict[tuple[str, str], int] = {}

    def __call__(self) -> None:
        topo, m = self.service.topo, self.service.metrics
        assert topo is not None
        if topo.controller is not self._controller:  # use_policy: its counters start again
            self._controller, self._cursor = topo.controller, 0
            self._asker.forget(CONTROLLER)  # an answer of the old one would count twice
            # The pools' counts are their own and outlive the controller: forgetting them
            # would export each pool's whole count again as new rejects or full stores.
            self.exported.retain(lambda key: key[0] in POOL_COUNTS)
            self._absorbed.clear()
        questions: dict[str, Any] = {CONTROLLER: functools.partial(
            topo.controller.options(timeout_s=ANSWER_TIMEOUT_S).metrics_since, self._cursor)}
        pools = dict(topo.pools)  # name -> handle; the watcher changes it as pools come and go
        for name, pool in pools.items():
            if self._handles.get(name, pool) is not pool:  # replaced: a pool pod restarted
                self._replaced(name)
            questions[POOL_PART + name] = pool.options(timeout_s=ANSWER_TIMEOUT_S).stats
        self._handles = pools
        answers = self._asker.ask(questions, self.deadline_s)
        m.set_scrape_parts({part: a.answered for part, a in answers.items()})
        if answers[CONTROLLER].answered:
            self._controller_figures(m, answers[CONTROLLER].value)
        self._pool_figures(m, {p: a for p, a in answers.items() if p != CONTROLLER})
        self.exported.retain(lambda key: key[0] not in POOL_COUNTS or key[1] in pools)
        cfg = self.service.cfg
        m.set_capacity("host", len(pools) * cfg.pool.pool_bytes)
        m.set_capacity("nvme", len(pools) * cfg.pool.nvme_bytes)
        m.set_capacity("hbm", len(topo.hbms) * (self.service.hbm_capacity
                                               or cfg.hbm.page_bytes * cfg.hbm.num_pages))

    def _replaced(self, name: str) -> None:
        """A new actor under a pool's name counts from 0: what the old one exported is
        forgotten, or its counts would hide the new one's until they passed them (the
        rejects and refused stores in between never counted), and the old one's late
        answer is thrown away."""
        self.exported.retain(lambda key: key[0] not in POOL_COUNTS or key[1] != name)
        self._asker.forget(POOL_PART + name)

    def _controller_figures(self, m: ServiceMetrics, got: MetricsSince) -> None:
        self._cursor = got.cursor
        for tier, seconds in got.waits:
            m.waited(tier, seconds)  # restores into HBM; gap migrations into host / NVMe
        for phases in got.phases:
            m.loaded(phases)
        m.set_occupancy("hbm", got.hbm_used)
        recompute = {(tenant, ""): tokens for tenant, tokens in got.recompute.items()}
        for tenant, _, tokens in self._increments(m, "recompute", recompute):
            m.recompute(tenant, tokens)
        for tenant, tier, nbytes in self._increments(m, "traffic", got.traffic):
            m.transfer(tenant, tier, nbytes)
        for tenant, codec, pages in self._increments(m, "codecs", got.codecs):
            m.stored(tenant, codec, pages)
        m.gave_room(self.exported.delta(("gave_room",), got.gave_room))

    def _increments(self, m: ServiceMetrics, kind: str, totals: Mapping[tuple[str, str], int]
                    ) -> list[tuple[str, str, int]]:
        """(tenant, what, increment) from cumulative ``(tenant, what) -> total``. A tenant
        without a label of its own is summed with the others into one overflow account
        (None), counted under the overflow label, with the erased tenants' totals
        (``RETIRED_TENANT``) less what was exported under their own labels before."""
        for (_, account, what), last in self.exported.take(
                lambda key: key[0] == kind and key[1] is not None
                and (key[1], key[2]) not in totals):  # retired since the last scrape
            self._absorbed[(kind, what)] = self._absorbed.get((kind, what), 0) + last
        summed: dict[tuple[str | None, str], int] = {}
        for (tenant, what), total in totals.items():
            account = None
            if tenant != RETIRED_TENANT:
                m.tenant(tenant)  # a first sighting takes a free label, as anywhere else
                account = tenant if m.tenant.has_own(tenant) else None
            summed[(account, what)] = summed.get((account, what), 0) + total
        return [(OTHER if account is None else account, what, self.exported.delta(
                    (kind, account, what),
                    total - (self._absorbed.get((kind, what), 0) if account is None else 0)))
                for (account, what), total in summed.items()]

    def _pool_figures(self, m: ServiceMetrics, answers: Mapping[str, Answer]) -> None:
        """Occupancy summed over the pools (a late one counts what it held when it last
        answered) and each pool's new verification rejects and NVMe-full stores."""
        self._pools = {p: v for p, v in self._pools.items() if p in answers}
        for part, answer in answers.items():
            if answer.answered:
                st = answer.value
                name, delta = st["name"], self.exported.delta
                self._pools[part] = PoolSeen(name, st["host_used_bytes"], st["nvme_live_bytes"],
                                             (st["nvme_reserve_bytes"],
                                              st["nvme_reserve_target_bytes"]))
                m.reject(name, delta(("rejects", name), st["rejects"]))
                m.nvme_full(name, delta(("spilled", name), st["nvme_full"] - st["refused_full"]),
                            delta(("refused", name), st["refused_full"]))
            elif answer.outcome is Outcome.FAILED and isinstance(answer.error, ActorGone) \
                    and not isinstance(answer.error, ActorSlow):  # slow: its last answer holds
                self._pools.pop(part, None)  # a dead pool holds nothing; the watcher forgets it
        m.set_occupancy("host", sum(p.host for p in self._pools.values()))
        m.set_occupancy("nvme", sum(p.nvme for p in self._pools.values()))
        m.set_nvme_reserves({p.name: p.reserve for p in self._pools.values()})
