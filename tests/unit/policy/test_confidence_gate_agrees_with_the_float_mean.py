"""The confidence gate (conservative-fallback test, paper §2.2) must never contradict
``sum(conf) / len(conf) < threshold`` as the policy would compute it in floats: it may
only answer None ("cannot tell") close to the threshold. The cases are checked by hand
from the IEEE-754 doubles involved, not from the gate's output."""

from __future__ import annotations

from agentkv_cluster.policy.confidence_gate import ConfidenceGate


def _gate(confidences: list[float]) -> ConfidenceGate:
    gate = ConfidenceGate()
    for pid, conf in enumerate(confidences):
        gate.put(pid, conf, counted=True)
    return gate


def test_rounding_case_where_the_exact_mean_and_the_float_mean_disagree():
    # ten copies of the double 0.1: exactly, their mean IS that double (not below 0.1);
    # summed in floats they give 0.9999999999999999, mean 0.09999999999999999 < 0.1.
    confidences = [0.1] * 10
    assert sum(confidences) == 0.9999999999999999
    float_answer = sum(confidences) / len(confidences) < 0.1
    assert float_answer is True
    # the gate must not answer the exact comparison (False): only True or None
    assert _gate(confidences).below(0.1) in (True, None)


def test_clear_cases_are_decided_and_counted_correctly():
    # mean 0.2 vs thresholds far away: decided, and by the mean over all counted pages
    gate = _gate([0.1, 0.3])
    assert gate.below(0.5) is True
    assert gate.below(0.1) is False
    # set_all: every counted page now 0.2 -> mean 0.2 (the count is kept)
    gate.set_all(0.2)
    assert gate.below(0.25) is True
    assert gate.below(0.15) is False


def test_dropped_and_uncounted_pages_leave_the_mean():
    gate = _gate([0.9, 0.1])  # mean 0.5
    gate.put(7, 0.0, counted=False)  # pinned: not counted
    assert gate.below(0.4) is False
    gate.drop(0)  # leaves only 0.1
    assert gate.below(0.4) is True
    gate.put(1, 0.8, counted=True)  # replaces 0.1 by 0.8
    assert gate.below(0.4) is False
    assert _gate([]).below(0.5) is False  # no counted page: no fallback


def test_values_outside_the_error_bound_make_the_gate_undecided():
    # the error bound holds for non-negative finite terms only
    for odd in (float("nan"), float("inf"), -0.25):
        gate = _gate([0.5, odd])
        assert gate.below(0.9) is None, odd
        gate.drop(1)
        assert gate.below(0.9) is True, odd  # back to the plain 0.5 < 0.9
