"""One host link for every transfer: prefetches queue behind restores and hold the link
for their own duration, and every restore from the link pays its jitter whatever form
the page was stored in. Checked with a scripted driver (real LRU order, planned
prefetches and demotion forms fixed by the test) so the timings are exact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentkv_cluster.policy.base import PageView, PrefetchAdmission
from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.drivers import Demotion, FullPrecisionDriver
from agentkv_cluster.sim.engine import BatchRun
from store.types import Codec, Tier
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()
RESTORE_MS = 1.2 + 120 * MB / 24e9 * 1e3  # one 120 MB page at full precision: 6.2 ms


class Scripted(FullPrecisionDriver):
    """LRU victims; page -> planned prefetch time; optional INT4 working copies.
    A landing prefetch is tracked by the policy and displaces LRU victims, as
    ``AgentKvPolicy.admit_prefetch`` does."""

    def __init__(self, prefetch: dict[int, float] | None = None, codec: Codec = Codec.FULL):
        super().__init__(LruPolicy(), CFG)
        self._prefetch = prefetch or {}
        self._codec = codec

    def demote(self, page: PageView, now: float) -> Demotion:
        return Demotion(tier=Tier.HOST, codec=self._codec,
                        stored_bytes=self.cost.stored_bytes(page.size_bytes, self._codec))

    def prefetch_at(self, page, demotion, now, tool_started=None):
        return self._prefetch.get(page.page_id)

    def admit_prefetch(self, page: PageView, need_bytes: int, now: float) -> PrefetchAdmission:
        victims = tuple(self.policy.select_victims(need_bytes, now)) if need_bytes else ()
        self.policy.on_insert(page, now)
        return PrefetchAdmission(page_id=page.page_id, admitted=True, victims=victims)

    def restore_s(self, page: PageView, demotion: Demotion) -> float:
        if demotion.codec is Codec.RECOMPUTE:  # the policy's own estimate (AgentKvDriver)
            return page.recompute_cost_s
        return super().restore_s(page, demotion)


def _five_pages(reads):
    # room for two 120 MB pages: E's, F's and G's creation evict A, B, E (LRU)
    return make_batch(sizes_mb=[120] * 5, created=[0.0, 0.1, 0.2, 0.3, 0.4], reads=reads,
                      capacity_mb=250)


def test_a_prefetch_waits_for_the_link_and_holds_it_for_its_duration():
    # 5.000 B is read (demand restore: link busy for one restore), 5.001 A's prefetch
    # starts (queued behind B), 5.002 E is read (queued behind A's prefetch), 5.003 A
    # is read while its prefetch is still in flight.
    reads = [[5.003], [5.0], [5.002], [], []]
    run = BatchRun(_five_pages(reads), Scripted(prefetch={0: 5.001}))
    tr = run.run()
    r = RESTORE_MS
    assert tr.access_hit == [False, False, False]
    b_visible = r
    e_visible = (3 * r - 2.0)  # waits for B's restore and A's prefetch, then its own
    a_visible = 2 * r - 3.0  # A's prefetch ran from B's end for one restore
    assert tr.access_visible_ms == pytest.approx([b_visible, e_visible, a_visible])
    assert tr.access_restore_ms == pytest.approx([r, r, r])
    assert tr.transfer_bytes == 3 * 120 * MB
    assert run.link_free_at == pytest.approx(5.0 + 3 * r / 1e3)


def test_a_prefetch_that_finds_the_link_free_starts_at_its_planned_time():
    reads = [[5.003], [], [], [], []]
    tr = BatchRun(_five_pages(reads), Scripted(prefetch={0: 5.0})).run()
    assert tr.access_visible_ms == pytest.approx([RESTORE_MS - 3.0])
    assert tr.access_restore_ms == pytest.approx([RESTORE_MS])


@pytest.mark.parametrize("codec", [Codec.FULL, Codec.INT8, Codec.INT4])
def test_every_restore_pays_its_page_jitter_whatever_its_form(codec):
    # A is evicted at E's creation and read at 5.0 (demand); B is evicted at F's
    # creation and prefetched at 6.0, read at 7.0 (landed: hidden).
    jitter = [0.7, 0.45, 0.0, 0.0, 0.0]
    batch = make_batch(sizes_mb=[120] * 5, created=[0.0, 0.1, 0.2, 0.3, 0.4],
                       reads=[[5.0], [7.0], [], [], []], capacity_mb=250, jitter_ms=jitter)
    driver = Scripted(prefetch={1: 6.0}, codec=codec)
    tr = BatchRun(batch, driver).run()
    base_ms = driver.cost.restore_time(120 * MB, Tier.HOST, codec) * 1e3
    assert tr.access_restore_ms == pytest.approx([base_ms + 0.7, base_ms + 0.45])
    assert tr.access_visible_ms == pytest.approx([base_ms + 0.7, 0.0])


def test_a_recomputed_page_pays_its_true_re_prefill_not_the_policy_estimate():
    # the cost model guesses 50 ms; re-prefilling A really takes 300 ms
    batch = dataclasses.replace(
        make_batch(sizes_mb=[120] * 3, created=[0.0, 0.1, 0.2], reads=[[5.0], [], []],
                   capacity_mb=250, jitter_ms=[0.7, 0.0, 0.0]),
        recompute_s=np.array([0.3, 0.3, 0.3]), recompute_est_s=np.array([0.05, 0.05, 0.05]))
    tr = BatchRun(batch, Scripted(codec=Codec.RECOMPUTE)).run()
    assert tr.access_hit == [False]
    assert tr.access_restore_ms == pytest.approx([300.0])  # no link, no jitter
    assert tr.access_visible_ms == pytest.approx([300.0])
    assert tr.transfer_bytes == 0
