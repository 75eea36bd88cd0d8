"""Victim selection from kept orders picks exactly the victims of a full sort per call.

Long random sequences of insert / access / update / remove / select_victims /
admit_prefetch / on_consumers_done / tracked (with in-place refreshes), at
repeated and changing ``now``, around the 256-page switch to numpy columns; at
every decision the policy's answer is compared with the full sort of
``reference_orders`` computed on the same records just before.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pytest

from agentkv_cluster.policy.agentkv import AgentKvConfig, AgentKvPolicy
from agentkv_cluster.policy.base import EndOfLife, Mechanisms, PageView, StateType
from agentkv_cluster.policy.baselines import (
    ArcPolicy,
    LruPolicy,
    SemanticPolicy,
    TrackedPolicy,
    TtlPolicy,
    take_exactly,
)
from agentkv_cluster.policy.predictor import PredictorConfig
from tests.unit.policy import reference_orders as ref
from tests.unit.policy.builders import MB

TYPES = list(StateType)
CONFIDENCES = (0.1, 0.3, 0.5, 0.5, 0.7, 0.9, 1.0)


class Run:
    """One random sequence against one policy, with the mirror of its resident set."""

    def __init__(self, policy: TrackedPolicy, order: Callable[[float], list[int]],
                 seed: int, nan_rate: float = 0.0) -> None:
        self.policy = policy
        self.order = order
        self.rng = random.Random(seed)
        self.resident: dict[int, PageView] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.next_id = 0
        self.now = 0.0
        self.live = False  # AgentKV records handed out and not reported since
        self.decisions = 0
        self.nan_rate = nan_rate
        self.gone: list[int] = []  # ids no longer tracked: inserted again at times

    # -------------------------------------------------------------- records
    def view(self) -> PageView:
        rng = self.rng
        if self.gone and rng.random() < 0.3:  # an id evicted or removed before comes back
            pid = self.gone.pop(rng.randrange(len(self.gone)))
        else:
            self.next_id += 1
            pid = self.next_id
        idle = rng.choice([0.5, 3.0, 9.0, rng.expovariate(0.3)])
        size = int(rng.choice([1, 2, 3, rng.uniform(0.5, 8)]) * MB)
        if rng.random() < self.nan_rate:  # no order: a NaN key (the full sort is used)
            idle, size = math.inf, 0
        return PageView(
            page_id=pid, size_bytes=size, state_type=rng.choice(TYPES),
            last_access=self.now - rng.choice([0.0, 0.0, 1.0, rng.uniform(0, 5)]),
            predicted_idle_s=idle, reuse_prob=rng.choice([0.2, 0.5, rng.random()]),
            confidence=rng.choice([*CONFIDENCES, rng.random()]),
            recompute_cost_s=rng.choice([0.0, 0.5, rng.uniform(0, 2)]),
            dependency=rng.choice([0.0, 0.0, 1.0]), importance=rng.choice([0.0, 0.2]),
            correctness_weight=rng.choice([0.0, 0.3, 0.6, 0.9]),
            pinned=rng.random() < 0.05)

    def refresh(self, v: PageView) -> None:
        """New values of the fields the orders read (the caller's refresh)."""
        rng = self.rng
        v.predicted_idle_s = rng.choice([0.1, 4.0, 30.0, rng.expovariate(0.2)])
        v.confidence = rng.choice([*CONFIDENCES, rng.random()])
        v.reuse_prob = rng.random()
        v.dependency = rng.choice([0.0, 1.0])
        v.importance = rng.choice([0.0, 0.5])
        v.correctness_weight = rng.choice([0.0, 0.6])
        if rng.random() < 0.2:
            v.pinned = not v.pinned
        if rng.random() < 0.1:
            v.size_bytes = int(rng.choice([1, 2, 5]) * MB)

    # -------------------------------------------------------------- steps
    def step(self) -> None:
        rng, policy = self.rng, self.policy
        r = rng.random()
        if r > 0.8:
            self.now += rng.choice([1e-3, 0.5, 1.0, 3.0, 10.0])
        elif r < 0.02:
            self.now = max(0.0, self.now - rng.choice([0.5, 2.0]))
        target = 230 if (self.decisions // 60) % 2 else 330
        grow = len(self.resident) < target
        op = rng.random()
        agentkv = isinstance(policy, AgentKvPolicy)
        if op < (0.55 if grow else 0.25) or not self.resident:
            v = self.view()
            policy.on_insert(v, self.now)
            self.resident[v.page_id] = v
            self.lru[v.page_id] = None
            self.live = False
        elif op < 0.7 if grow else op < 0.6:
            self.select()
        elif op < 0.68:
            pid = rng.choice(list(self.resident))
            v = self.resident[pid]
            if rng.random() < 0.2:  # a new record object for the same page
                v = PageView(**{f: getattr(v, f) for f in PageView.__dataclass_fields__})
                self.resident[pid] = v
            v.last_access = self.now
            v.access_count += 1
            policy.on_access(v, self.now)
            self.lru.move_to_end(pid)
            self.live = False
        elif op < 0.78:
            v = self.resident[rng.choice(list(self.resident))]
            self.refresh(v)
            policy.on_update(v, self.now)
            self.live = False
        elif op < 0.83:
            pid = rng.choice(list(self.resident))
            policy.on_remove(pid)
            self.forget(pid)
            self.live = False
        elif op < 0.87:
            self.consumers_done()
        elif op < 0.92 and agentkv:
            self.admit()
        elif op < 0.935 and agentkv:  # the simulator's periodic refresh: one value for all
            threshold = policy.config.predictor.confidence_threshold
            policy.set_confidence(rng.choice([0.0, 0.2, threshold, threshold * (1 - 1e-15),
                                              0.9, 1.0]))
        elif op < 0.96:
            views = list(policy.tracked())
            if agentkv:  # refreshed in place, not reported (the service's refresh)
                for v in rng.sample(views, min(len(views), 20)):
                    self.refresh(v)
                self.live = True
        else:
            self.toggle_pins()

    def toggle_pins(self) -> None:
        """Pins flipped in place: every policy reads ``pinned`` live at selection;
        AgentKV's conservative test reads it live only after ``tracked``."""
        if isinstance(self.policy, AgentKvPolicy) and not self.live:
            return
        for v in self.rng.sample(list(self.resident.values()), min(len(self.resident), 8)):
            v.pinned = not v.pinned

    def forget(self, pid: int) -> None:
        del self.resident[pid]
        del self.lru[pid]
        self.gone.append(pid)

    def select(self) -> None:
        need = self.rng.choice([0, 1, MB, 2 * MB, 3 * MB, 8 * MB, 10_000 * MB])
        expected = take_exactly(self.order(self.now), self.resident, need) if need else []
        got = self.policy.select_victims(need, self.now)
        assert got == expected, (self.decisions, self.now, len(self.resident))
        for pid in got:
            self.forget(pid)
        if got:
            self.live = False
        self.decisions += 1

    def admit(self) -> None:
        policy = self.policy
        assert isinstance(policy, AgentKvPolicy)
        v = self.view()
        need = self.rng.choice([0, MB, 4 * MB, 10_000 * MB])
        not_before = self.rng.choice([None, self.now, self.now + 5.0])
        if policy._conservative() != ref.agentkv_conservative(policy, self.resident):
            raise AssertionError("the kept fallback test differs from the full sum")
        order = ref.agentkv_admission(policy, self.resident, v, self.now, not_before)
        victims = take_exactly(order, self.resident, need) if need > 0 else []
        got = policy.admit_prefetch(v, need, self.now, not_before=not_before)
        assert got.admitted == (need <= 0 or bool(victims))
        assert list(got.victims) == (victims if got.admitted else [])
        if not got.admitted:
            self.gone.append(v.page_id)
        if got.admitted:
            for pid in got.victims:
                self.forget(pid)
            self.resident[v.page_id] = v
            self.lru[v.page_id] = None
            self.live = False
        self.decisions += 1

    def consumers_done(self) -> None:
        pid = self.rng.choice(list(self.resident))
        v = self.resident[pid]
        v.dependency = 0.0
        decision = self.policy.on_consumers_done(
            v, self.now, retirable=self.rng.random() < 0.6,
            signal=self.rng.choice(list(EndOfLife)))
        if decision.retire:
            self.forget(pid)
        self.live = False


def run_many(make: Callable[[], TrackedPolicy],
             order: Callable[[TrackedPolicy, Run], Callable[[float], list[int]]],
             seed: int, steps: int = 3000, nan_rate: float = 0.0) -> Run:
    policy = make()
    run = Run(policy, lambda now: [], seed, nan_rate)
    run.order = order(policy, run)
    for _ in range(240):  # start just below the switch to numpy columns
        v = run.view()
        policy.on_insert(v, run.now)
        run.resident[v.page_id] = v
        run.lru[v.page_id] = None
    for _ in range(steps):
        run.step()
    return run


AGENTKV_CONFIGS = {
    "default": AgentKvConfig(),
    "no-risk-control": AgentKvConfig(mechanisms=Mechanisms(risk_control=False)),
    "no-event-dependency": AgentKvConfig(mechanisms=Mechanisms(event_dependency=False)),
}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("config", list(AGENTKV_CONFIGS))
def test_agentkv_kept_order_picks_the_full_sort_victims(config, seed):
    run = run_many(lambda: AgentKvPolicy(AGENTKV_CONFIGS[config]),
                   lambda p, r: lambda now: ref.agentkv_order(p, r.resident, now), seed)
    assert run.decisions > 600
    policy = run.policy
    assert isinstance(policy, AgentKvPolicy)
    assert policy._conservative() == ref.agentkv_conservative(policy, run.resident)


@pytest.mark.parametrize("policy", ["agentkv", "ttl", "semantic"])
def test_keys_without_an_order_fall_back_to_the_full_sort(policy):
    """A NaN key (an infinite idle time on an empty page) has no total order: the
    call uses the full sort, whose result depends on its algorithm."""
    make, order = {
        "agentkv": (AgentKvPolicy,
                    lambda p, r: lambda now: ref.agentkv_order(p, r.resident, now)),
        "ttl": (TtlPolicy, lambda p, r: lambda now: ref.ttl_order(r.resident, now)),
        "semantic": (SemanticPolicy, lambda p, r: lambda now: ref.semantic_order(
            p, r.resident)),
    }[policy]
    with np.errstate(invalid="ignore"):
        run_many(make, order, seed=7, steps=1500, nan_rate=0.02)


@pytest.mark.parametrize("seed", [8, 9])
def test_conservative_test_matches_the_float_mean_at_the_threshold(seed):
    """The kept exact sum decides only where the float mean provably falls on the same
    side; at the threshold and one float either side of it, it must still agree."""
    rng = random.Random(seed)
    cases = [[0.1, 0.1, 0.1]]  # float mean 0.1 + 1 ulp: exactly 0.1 it is not
    cases += [[rng.choice([0.1, 0.2, 0.3, 0.7, rng.random()]) for _ in range(rng.randint(1, 40))]
              for _ in range(60)]
    for confs in cases:
        views = [PageView(page_id=i, size_bytes=MB, state_type=StateType.EVIDENCE,
                          confidence=c, pinned=rng.random() < 0.1) for i, c in enumerate(confs)]
        counted = [v.confidence for v in views if not v.pinned]
        mean = sum(counted) / len(counted) if counted else 0.5
        for threshold in (mean, math.nextafter(mean, 0.0), math.nextafter(mean, 1.0)):
            policy = AgentKvPolicy(AgentKvConfig(
                predictor=PredictorConfig(confidence_threshold=threshold)))
            for v in views:
                policy.on_insert(v, 0.0)
            assert policy._conservative() == ref.agentkv_conservative(
                policy, {v.page_id: v for v in views}), (confs, threshold)


def test_agentkv_reuses_one_sort_for_many_calls_at_one_now():
    """A model call's blocks arrive at one ``now``: the order is sorted once."""
    policy = AgentKvPolicy()
    for pid in range(2000):
        policy.on_insert(PageView(page_id=pid, size_bytes=MB, state_type=StateType.EVIDENCE,
                                  predicted_idle_s=float(pid % 7), confidence=0.9), 5.0)
    before = policy._by_density.rebuilds
    for pid in range(2000, 2500):
        assert len(policy.select_victims(MB, 6.0)) == 1
        policy.on_insert(PageView(page_id=pid, size_bytes=MB, state_type=StateType.EVIDENCE,
                                  confidence=0.9), 6.0)
    assert policy._by_density.rebuilds == before + 1


@pytest.mark.parametrize("seed", [4, 5])
def test_lru_victims_are_the_least_recently_used(seed):
    run_many(LruPolicy, lambda p, r: lambda now: list(r.lru), seed)


@pytest.mark.parametrize("seed", [4, 5, 6])
@pytest.mark.parametrize("signals", [(), tuple(EndOfLife)], ids=["paper", "fair"])
def test_ttl_kept_order_picks_the_full_sort_victims(seed, signals):
    run_many(lambda: TtlPolicy(signals=signals),
             lambda p, r: lambda now: ref.ttl_order(r.resident, now), seed)


@pytest.mark.parametrize("seed", [4, 5, 6])
@pytest.mark.parametrize("signals", [(), tuple(EndOfLife)], ids=["paper", "fair"])
def test_semantic_kept_order_picks_the_full_sort_victims(seed, signals):
    run_many(lambda: SemanticPolicy(signals=signals),
             lambda p, r: lambda now: ref.semantic_order(p, r.resident), seed)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_arc_lazy_order_picks_the_full_list_victims(seed):
    run_many(lambda: ArcPolicy(1500 * MB, signals=(EndOfLife.TASK_END,)),
             lambda p, r: lambda now: ref.arc_order(p, r.resident), seed)
