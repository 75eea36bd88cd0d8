"""One contract suite for every EvictionPolicy, plus exact victim orders per policy."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.agentkv import AgentKvPolicy
from agentkv_cluster.policy.base import (
    DuplicatePage,
    EndOfLife,
    EvictionPolicy,
    InvalidPageView,
    StateType,
    UnknownPage,
)
from agentkv_cluster.policy.baselines import ArcPolicy, LruPolicy, SemanticPolicy, TtlPolicy
from tests.unit.policy.builders import MB, page

FACTORIES = {
    "lru": LruPolicy,
    "ttl": TtlPolicy,
    "semantic": SemanticPolicy,
    "arc": lambda: ArcPolicy(capacity_bytes=10 * MB),
    "agentkv": AgentKvPolicy,
}


@pytest.fixture(params=sorted(FACTORIES))
def policy(request) -> EvictionPolicy:
    return FACTORIES[request.param]()


class TestContract:
    def test_implements_the_protocol(self, policy):
        assert isinstance(policy, EvictionPolicy)
        assert policy.name in FACTORIES

    def test_evicts_exactly_enough(self, policy):
        for i in range(5):
            policy.on_insert(page(i, size_mb=1, last_access=float(i)), now=float(i))
        victims = policy.select_victims(int(1.5 * MB), now=10.0)
        assert len(victims) == 2  # 1 MB is not enough, 2 MB is; a third would be too many
        assert policy.resident_bytes() == 3 * MB

    def test_not_enough_changes_nothing(self, policy):
        policy.on_insert(page(1, size_mb=2), now=0.0)
        policy.on_insert(page(2, size_mb=2, pinned=True), now=0.0)
        assert policy.select_victims(3 * MB, now=1.0) == []
        assert policy.resident_bytes() == 4 * MB
        assert policy.select_victims(2 * MB, now=1.0) == [1]  # the pinned page is never a victim

    def test_zero_need_evicts_nothing_and_negative_raises(self, policy):
        policy.on_insert(page(1), now=0.0)
        assert policy.select_victims(0, now=1.0) == []
        with pytest.raises(ValueError):
            policy.select_victims(-1, now=1.0)
        assert policy.resident_bytes() == MB

    def test_duplicate_unknown_and_invalid_are_rejected(self, policy):
        policy.on_insert(page(1), now=0.0)
        with pytest.raises(DuplicatePage):
            policy.on_insert(page(1), now=0.0)
        with pytest.raises(UnknownPage):
            policy.on_access(page(2), now=0.0)
        with pytest.raises(UnknownPage):
            policy.on_remove(2)
        with pytest.raises(InvalidPageView):
            policy.on_insert(page(3, reuse_prob=1.5), now=0.0)
        assert policy.resident_bytes() == MB

    def test_remove_forgets_and_update_resizes(self, policy):
        policy.on_insert(page(1, size_mb=1), now=0.0)
        policy.on_insert(page(2, size_mb=1), now=0.0)
        policy.on_update(page(2, size_mb=3), now=1.0)
        assert policy.resident_bytes() == 4 * MB
        policy.on_remove(1)
        assert policy.resident_bytes() == 3 * MB
        assert policy.select_victims(MB, now=2.0) == [2]


def test_lru_exact_order():
    lru = LruPolicy()
    for i in range(1, 6):
        lru.on_insert(page(i), now=float(i))
    lru.on_access(page(2), now=6.0)
    lru.on_access(page(1), now=7.0)
    assert lru.select_victims(3 * MB, now=8.0) == [3, 4, 5]
    assert lru.select_victims(2 * MB, now=8.0) == [2, 1]


@pytest.mark.parametrize(
    ("pages", "expected"),
    [
        # (id, size MB, last_access, predicted idle) at now=10: remaining x size decides
        # 9, 0, 0: the tie goes to the older access (3)
        ([(1, 1, 9.0, 10.0), (2, 4, 9.0, 1.0), (3, 1, 0.0, 5.0)], [1, 3, 2]),
        ([(1, 2, 8.0, 4.0), (2, 1, 8.0, 9.0), (3, 1, 5.0, 1.0)], [2, 1, 3]),  # 2*2=4, 7, 0
    ],
)
def test_ttl_order(pages, expected):
    ttl = TtlPolicy()
    for pid, size, last, idle in pages:
        ttl.on_insert(page(pid, size_mb=size, last_access=last, predicted_idle_s=idle), now=last)
    total = sum(size for _, size, _, _ in pages) * MB
    assert ttl.select_victims(total, now=10.0) == expected


def test_semantic_order_type_then_importance_then_correctness():
    sem = SemanticPolicy()
    sem.on_insert(page(1, state_type=StateType.FIXED_PREFIX), now=0.0)  # 1.0
    sem.on_insert(page(2, state_type=StateType.FAILED_BRANCH, importance=0.2), now=0.0)  # 0.2
    sem.on_insert(page(3, state_type=StateType.TEMP_REASONING), now=0.0)  # 0.3
    sem.on_insert(page(4, state_type=StateType.FAILED_BRANCH, correctness_weight=0.1,
                       last_access=1.0), now=1.0)  # 0.1
    sem.on_insert(page(5, state_type=StateType.FAILED_BRANCH, correctness_weight=0.1),
                  now=0.0)  # 0.1, older
    assert sem.priority(page(9, state_type=StateType.VERIFIED_RESULT, importance=0.5,
                             correctness_weight=1.0)) == pytest.approx(2.4)
    assert sem.select_victims(5 * MB, now=2.0) == [5, 4, 2, 3, 1]


def test_arc_exact_victims_and_adaptation():
    arc = ArcPolicy(capacity_bytes=4 * MB)
    for i in (1, 2, 3, 4):
        arc.on_insert(page(i), now=float(i))
    arc.on_access(page(1), now=5.0)  # 1 -> T2
    arc.on_access(page(2), now=6.0)  # 2 -> T2
    assert arc.lists == {"t1": [3, 4], "t2": [1, 2], "b1": [], "b2": []}
    # p = 0: T1 (2 MB) exceeds p, so T1 is emptied first (LRU end), then T2
    assert arc.select_victims(3 * MB, now=7.0) == [3, 4, 1]
    assert arc.lists == {"t1": [], "t2": [2], "b1": [3, 4], "b2": [1]}
    arc.on_insert(page(3), now=8.0)  # ghost hit in B1: p grows by max(|B2|/|B1|, 1) x size
    assert arc.p == MB
    assert arc.lists["t2"] == [2, 3]
    arc.on_insert(page(5), now=9.0)  # new: T1
    arc.on_insert(page(6), now=9.0)
    # T1 = 2 MB > p = 1 MB: take 5; then T1 = 1 MB is not above p, so T2's LRU (2)
    assert arc.select_victims(2 * MB, now=10.0) == [5, 2]
    arc.on_insert(page(1), now=11.0)  # ghost hit in B2 shrinks p
    assert arc.p == 0.0
    assert arc.lists["t2"] == [3, 1]


def test_arc_ghost_lists_stay_bounded():
    arc = ArcPolicy(capacity_bytes=4 * MB)
    for i in range(100):
        arc.on_insert(page(i), now=float(i))
        if arc.resident_bytes() > 4 * MB:
            arc.select_victims(MB, now=float(i))
    lists = arc.lists
    assert len(lists["t1"]) + len(lists["t2"]) == 4
    assert len(lists["t1"]) + len(lists["b1"]) <= 4  # |T1| + |B1| <= c
    assert sum(len(v) for v in lists.values()) <= 8  # total <= 2c


# ---------------------------------------------------------------- end-of-life signals
SIGNAL_FACTORIES = {
    "lru": lambda sig: LruPolicy(signals=sig),
    "ttl": lambda sig: TtlPolicy(signals=sig),
    "semantic": lambda sig: SemanticPolicy(signals=sig),
    "arc": lambda sig: ArcPolicy(capacity_bytes=10 * MB, signals=sig),
}


@pytest.mark.parametrize("signal", list(EndOfLife), ids=lambda s: s.value)
@pytest.mark.parametrize("name", sorted(SIGNAL_FACTORIES))
def test_a_baseline_given_a_signal_frees_the_page(name, signal):
    """Fails for any baseline that ignores a signal it was built to act on."""
    policy = SIGNAL_FACTORIES[name]([signal])
    for i in range(3):
        policy.on_insert(page(i, size_mb=2, last_access=float(i)), now=float(i))
    decision = policy.on_consumers_done(page(1, size_mb=2, dependency=0.0), now=5.0,
                                        signal=signal)
    assert decision.retire is True and signal.value in decision.reason
    assert 1 not in policy and len(policy) == 2
    assert policy.resident_bytes() == 4 * MB
    # the freed page is not a victim any more (nor a ghost that adapts ARC)
    assert 1 not in policy.select_victims(4 * MB, now=6.0)


@pytest.mark.parametrize("name", sorted(SIGNAL_FACTORIES))
def test_a_baseline_acts_only_on_the_signals_it_was_given(name):
    given = EndOfLife.TASK_END
    policy = SIGNAL_FACTORIES[name]([given])
    policy.on_insert(page(1, size_mb=2), now=0.0)
    for other in set(EndOfLife) - {given}:
        assert policy.on_consumers_done(page(1, size_mb=2), 1.0, signal=other).retire is False
    assert 1 in policy
    # an event graph that still blocks retirement (rollback, audit) wins over the signal
    assert policy.on_consumers_done(page(1, size_mb=2), 1.0, signal=given,
                                    retirable=False).retire is False
    assert policy.on_consumers_done(page(1, size_mb=2), 1.0, signal=given).retire is True


@pytest.mark.parametrize("name", sorted(SIGNAL_FACTORIES))
def test_paper_faithful_baselines_keep_signalled_pages(name):
    policy = SIGNAL_FACTORIES[name](())
    policy.on_insert(page(1, size_mb=2), now=0.0)
    for signal in EndOfLife:
        assert policy.on_consumers_done(page(1, size_mb=2), 1.0, signal=signal).retire is False
    assert 1 in policy and policy.resident_bytes() == 2 * MB


def test_signals_must_be_end_of_life_members():
    with pytest.raises(TypeError, match="EndOfLife"):
        LruPolicy(signals=["task_end"])


@pytest.mark.parametrize("factory", [TtlPolicy, SemanticPolicy], ids=["ttl", "semantic"])
def test_columnar_victim_order_equals_the_per_page_order(factory):
    """Large resident sets are ranked over numpy rows; the order must be the per-page
    order exactly, after inserts, accesses, updates, evictions and removals."""
    import random

    from agentkv_cluster.policy.columns import COLUMNAR_MIN_PAGES

    rng = random.Random(5)
    policy = factory()
    types = list(StateType)
    views = {}
    for i in range(COLUMNAR_MIN_PAGES + 150):
        views[i] = page(i, size_mb=rng.choice([1, 2, 3]), state_type=rng.choice(types),
                        last_access=float(rng.randint(0, 20)),
                        predicted_idle_s=rng.choice([0.5, 3.0, 9.0]),
                        importance=rng.choice([0.0, 0.2]))
        policy.on_insert(views[i], now=0.0)
    for step in range(200):
        i = rng.choice(list(views))
        v = views[i]
        if step % 3 == 0:
            v.last_access = 20.0 + step
            policy.on_access(v, now=v.last_access)
        elif step % 3 == 1:
            v.predicted_idle_s = rng.choice([0.1, 4.0, 30.0])
            v.importance = rng.choice([0.0, 0.5])
            policy.on_update(v, now=20.0 + step)
        elif step % 7 == 2:
            policy.on_remove(i)
            del views[i]
    for pid in policy.select_victims(5 * MB, now=250.0):
        del views[pid]
    assert len(policy) >= COLUMNAR_MIN_PAGES
    now = 260.0
    columnar = list(policy._victim_order(now))
    if factory is TtlPolicy:
        key = lambda p: (-max(0.0, p.last_access + p.predicted_idle_s - now) * p.size_bytes,
                         p.last_access, p.page_id)
    else:
        key = lambda p: (policy.priority(p), p.last_access, p.page_id)
    assert columnar == [p.page_id for p in sorted(views.values(), key=key)]
