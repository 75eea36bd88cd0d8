"""AgentKV through the simulator: compressed demotion, gap prefetch, retirement."""

from __future__ import annotations

import pytest

from agentkv_cluster.lifecycle.types import StateType as S
from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.sim.agentkv_driver import AgentKvDriver, PredictionSkill
from agentkv_cluster.sim.config import MB, SimConfig
from agentkv_cluster.sim.engine import RETIRED, BatchRun, BatchTrace
from store.types import Codec, Tier
from tests.unit.sim.conftest import make_batch

CFG = SimConfig()
INT4_RESTORE_MS = 1.2 + 100 * MB / 3.2 / 24e9 * 1e3


def scenario():
    # A (evidence) idles 20 s; B and C are read soon. C's creation evicts A.
    return make_batch(
        sizes_mb=[100, 100, 100], created=[0.0, 0.5, 1.0], reads=[[20.0], [2.0], [1.5]],
        capacity_mb=250, types=[S.EVIDENCE, S.TOOL_OBSERVATION, S.TOOL_OBSERVATION],
        predicted=[[20.0], [1.5], [0.5]], eol=[20.0, 2.0, 1.5])


def trained_predictor() -> Predictor:
    """A predictor that has seen these tool classes (confident, not conservative)."""
    predictor = Predictor()
    for tool in (S.EVIDENCE.value, S.TOOL_OBSERVATION.value):
        for _ in range(40):
            predictor.observe_tool(tool, 5.0)
    return predictor


def trained_skill() -> PredictionSkill:
    """Gap predictions that have been right so far (AgentKV trusts them)."""
    skill = PredictionSkill()
    for _ in range(200):
        skill.observe(2.0, 2.0)
    return skill


def run(mech: Mechanisms, predictor: Predictor | None = None):
    trained = predictor is None
    driver = AgentKvDriver(CFG, mech, predictor or trained_predictor(),
                           trained_skill() if trained else PredictionSkill())
    r = BatchRun(scenario(), driver)
    return r, r.run()


def test_victim_is_compressed_and_its_restore_is_hidden_by_the_gap_prefetch():
    r, tr = run(Mechanisms())
    d = r.slots[0].demotion
    assert (d.tier, d.codec, d.reference) == (Tier.HOST, Codec.INT4, True)
    assert d.stored_bytes == 31_250_000
    assert tr.access_hit == [True, True, False]
    assert tr.access_restore_ms[2] == pytest.approx(INT4_RESTORE_MS)
    assert tr.access_visible_ms[2] == 0.0  # landed before the read
    assert tr.transfer_bytes == 31_250_000 and tr.wasted_prefetch_bytes == 0
    assert [s.where for s in r.slots] == [RETIRED] * 3  # every consumer done


def test_without_gap_prefetch_the_same_restore_is_visible():
    _, tr = run(Mechanisms(gap_prefetch=False))
    assert tr.access_visible_ms[2] == pytest.approx(INT4_RESTORE_MS)
    assert tr.transfer_bytes == 31_250_000


def test_without_event_dependency_committed_pages_linger_and_cost_demotions():
    _, full = run(Mechanisms())
    r, tr = run(Mechanisms(event_dependency=False))
    assert tr.access_visible_ms[2] == pytest.approx(INT4_RESTORE_MS)
    # committed pages stay in HBM and have to be pushed out: more bytes demoted
    assert tr.demoted_bytes > full.demoted_bytes == 31_250_000
    assert RETIRED not in [s.where for s in r.slots]


def test_an_untrained_predictor_makes_agentkv_conservative():
    r, tr = run(Mechanisms(), Predictor())
    assert r.slots[0].view.confidence < 0.5  # it has learned from one read by the end
    d = r.slots[0].demotion
    assert (d.tier, d.codec) == (Tier.HOST, Codec.FULL)  # safest form, LRU order
    assert tr.transfer_bytes == 100 * MB


def test_prediction_skill_needs_data_and_drops_with_the_observed_error():
    skill = PredictionSkill(prior=16)
    assert skill.confidence() == 0.0  # nothing seen: not trusted
    for _ in range(16):
        skill.observe(2.0, 2.0)
    assert skill.confidence() == pytest.approx(0.5)  # exact so far, half the data weight
    bad = PredictionSkill(prior=16)
    for _ in range(16):
        bad.observe(2.0, 2.0 * 2.718281828459045)  # |log error| 1 of the 1.5 scale
    assert bad.confidence() == pytest.approx(0.5 * (1 - 1 / 1.5))


def test_return_model_learns_every_gap_outcome_and_gates_the_prefetch():
    """Every gap opens at production or a read and closes at the next read (a return)
    or the end-of-life signal (an end); the batch's end closes the rest. A return model
    that has seen pages of A's kind come back only within 1 s or never skips A's
    prefetch (the read then pays a visible restore); one that has seen them come
    back after about 20 s prefetches it."""
    from agentkv_cluster.policy.returns import ReturnModel
    from tests.unit.policy.builders import page

    def with_history(gap_s: float, returned: int, ended: int) -> tuple[ReturnModel, BatchTrace]:
        returns = ReturnModel()
        proto = page(10_000, state_type=S.EVIDENCE, tool_class=S.EVIDENCE.value)
        for _ in range(returned):
            returns.observe_return(proto, gap_s)
        for _ in range(ended):
            returns.observe_end(proto, 300.0)
        driver = AgentKvDriver(CFG, Mechanisms(), trained_predictor(), trained_skill(),
                               returns)
        before = returns.observed
        tr = BatchRun(scenario(), driver).run()
        # three pages: three reads, three signals, no gap left open
        assert returns.observed - before == 6 and not returns._open
        return returns, tr

    _, dead = with_history(1.0, 20, 20)
    assert dead.access_visible_ms[2] > 0.0 and dead.wasted_prefetch_bytes == 0
    _, alive = with_history(25.0, 40, 2)
    assert alive.access_visible_ms[2] == 0.0  # prefetched, landed before the read
