"""The loop keeps a page's state from its production until it is done, and a view made
at production gives the same run as every view made at the batch's start."""

from __future__ import annotations

from agentkv_cluster.policy.baselines import LruPolicy
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver
from agentkv_cluster.sim.engine import IN_HBM, LOWER, BatchRun, PageEnd
from store.types import Codec, Tier
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()


class _ViewsUpFront(FullPrecisionDriver):
    views_on_demand = False


def _batch():
    # 10 MB pages, room for two: each new page evicts the least recently used one
    return make_batch(sizes_mb=[10] * 5, created=[0.0, 1.0, 2.0, 3.0, 4.0],
                      reads=[[1.5, 5.0], [2.5], [], [6.0], []], capacity_mb=20,
                      eol=[9.0, 9.0, float("inf"), 9.0, float("inf")])


def test_a_view_made_at_production_gives_the_run_of_views_made_up_front():
    # the batch carries no recompute or correctness truth: both come from the views
    lazy = BatchRun(_batch(), FullPrecisionDriver(LruPolicy(), CFG)).run()
    eager = BatchRun(_batch(), _ViewsUpFront(LruPolicy(), CFG)).run()
    assert lazy == eager and lazy.demoted_bytes > 0 and lazy.transfer_bytes > 0


def test_a_done_page_leaves_where_it_ended_and_its_last_demotion():
    run = BatchRun(_batch(), FullPrecisionDriver(LruPolicy(), CFG))
    run.run()
    ends = run.slots
    done = [i for i, s in enumerate(ends) if isinstance(s, PageEnd)]
    live = [i for i, s in enumerate(ends) if not isinstance(s, PageEnd)]
    assert done and live
    for i in done:  # nothing to come, out of HBM
        assert ends[i].where == LOWER and ends[i].demotions >= 1 and ends[i].view is None
        assert (ends[i].demotion.tier, ends[i].demotion.codec) == (Tier.HOST, Codec.FULL)
    assert all(ends[i].where == IN_HBM or ends[i].due for i in live)
    up_front = BatchRun(_batch(), _ViewsUpFront(LruPolicy(), CFG))
    up_front.run()
    assert [s.view.page_id for s in up_front.slots] == list(range(5))  # views kept
