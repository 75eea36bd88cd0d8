"""Return model boundaries (paper §2.4 prefetch, "P(read again | silent until t)"):
a gap counts as evidence only if it lasted LONGER than the silence already seen (a gap
that ended exactly now would already have returned), and the model is trained from
``min_outcomes`` outcomes on ("below this many outcomes, trained is False")."""

from __future__ import annotations

import pytest

from agentkv_cluster.policy.returns import ReturnConfig, ReturnModel
from tests.unit.policy.builders import page


def _silent(pid: int, last_access: float = 0.0):
    return page(pid, session="s", tool_class="think", last_access=last_access,
                reuse_prob=0.5, dependency=1.0)


def test_a_gap_that_ended_exactly_at_the_elapsed_silence_no_longer_counts():
    m = ReturnModel(ReturnConfig(prior=0.0, min_outcomes=1))
    m.observe_return(_silent(1001), 5.0)
    m.observe_return(_silent(1002), 10.0)
    m.observe_end(_silent(2001), 20.0)
    # silent 0 s: all three gaps lasted longer -> returns 2 of 3
    assert m.p_return(_silent(1), now=0.0) == pytest.approx(2 / 3)
    # silent exactly 5 s: the 5 s return is behind us; gaps longer than 5 s: 10 (return)
    # and 20 (end) -> 1 / 2
    assert m.p_return(_silent(1), now=5.0) == pytest.approx(1 / 2)
    # silent exactly 10 s: only the 20 s end lasted longer -> 0
    assert m.p_return(_silent(1), now=10.0) == 0.0


def test_trained_from_exactly_min_outcomes():
    m = ReturnModel(ReturnConfig(min_outcomes=2))
    assert not m.trained
    m.observe_return(_silent(1), 1.0)
    assert not m.trained  # 1 < 2
    m.observe_end(_silent(2), 1.0)
    assert m.trained  # 2 outcomes: no longer below min_outcomes
