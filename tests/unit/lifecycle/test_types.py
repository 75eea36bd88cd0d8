"""State types of Table 1, their defaults, and the type transitions."""

from __future__ import annotations

import pytest

from agentkv_cluster.lifecycle.types import (
    TYPE_DEFAULTS,
    IllegalTypeTransition,
    Reuse,
    StateType,
    TypeSignal,
    TypeTag,
    retype,
    reuse_for,
)

T = StateType
S = TypeSignal


def test_exactly_the_seven_table1_types() -> None:
    assert [t.name for t in StateType] == [
        "FIXED_PREFIX", "TASK_INPUT", "EVIDENCE", "TOOL_OBSERVATION", "VERIFIED_RESULT",
        "TEMP_REASONING", "FAILED_BRANCH",
    ]


def test_every_type_has_defaults() -> None:
    assert set(TYPE_DEFAULTS) == set(StateType)
    with pytest.raises(TypeError):
        TYPE_DEFAULTS[T.EVIDENCE] = TYPE_DEFAULTS[T.TASK_INPUT]  # type: ignore[index]


def test_paper_reuse_probabilities() -> None:
    assert TYPE_DEFAULTS[T.FIXED_PREFIX].reuse_prob == 0.99
    assert TYPE_DEFAULTS[T.FAILED_BRANCH].reuse_prob == 0.12
    assert min(TYPE_DEFAULTS.values(), key=lambda d: d.reuse_prob) is TYPE_DEFAULTS[T.FAILED_BRANCH]
    assert max(TYPE_DEFAULTS.values(), key=lambda d: d.reuse_prob) is TYPE_DEFAULTS[T.FIXED_PREFIX]


@pytest.mark.parametrize("attr", ["recompute_weight", "correctness_weight"])
def test_verified_result_has_strictly_highest_weight(attr: str) -> None:
    verified = getattr(TYPE_DEFAULTS[T.VERIFIED_RESULT], attr)
    others = [getattr(d, attr) for t, d in TYPE_DEFAULTS.items() if t is not T.VERIFIED_RESULT]
    assert verified > max(others)


@pytest.mark.parametrize(("state_type", "policy_fragment", "keep_reference", "recompute_entry"), [
    (T.FIXED_PREFIX, "shared across turns", True, True),
    (T.TASK_INPUT, "resident while active", False, True),
    (T.EVIDENCE, "keep a reversible copy first", True, False),
    (T.TOOL_OBSERVATION, "prefetch in tool gaps", False, False),
    (T.VERIFIED_RESULT, "never irreversibly deleted early", True, True),
    (T.TEMP_REASONING, "keep recompute entry", False, True),
    (T.FAILED_BRANCH, "keep audit summary only", False, False),
])
def test_table1_default_policies(state_type: StateType, policy_fragment: str,
                                 keep_reference: bool, recompute_entry: bool) -> None:
    d = TYPE_DEFAULTS[state_type]
    assert policy_fragment in d.policy
    assert d.keep_reference is keep_reference
    assert d.keep_recompute_entry is recompute_entry
    assert all(0.0 <= x <= 1.0 for x in (d.reuse_prob, d.recompute_weight, d.correctness_weight))


# (type, signal) -> (new type, cold, read_only); None: IllegalTypeTransition
_TRANSITIONS = {
    (T.TOOL_OBSERVATION, S.SUPERSEDED): (T.TOOL_OBSERVATION, True, False),
    (T.TEMP_REASONING, S.VERIFIED): (T.VERIFIED_RESULT, False, False),
    (T.TEMP_REASONING, S.BRANCH_FAILED): (T.FAILED_BRANCH, True, False),
    (T.TOOL_OBSERVATION, S.BRANCH_FAILED): (T.FAILED_BRANCH, True, False),
    (T.EVIDENCE, S.BRANCH_FAILED): (T.FAILED_BRANCH, True, False),
    (T.FIXED_PREFIX, S.PREFIX_VERSION_BUMP): (T.FIXED_PREFIX, False, True),
}


@pytest.mark.parametrize("state_type", list(StateType))
@pytest.mark.parametrize("signal", list(TypeSignal))
def test_type_transition_table(state_type: StateType, signal: TypeSignal) -> None:
    tag = TypeTag(state_type=state_type, generation=3)
    expected = _TRANSITIONS.get((state_type, signal))
    if expected is None:
        with pytest.raises(IllegalTypeTransition):
            retype(tag, signal)
        assert tag == TypeTag(state_type=state_type, generation=3)  # frozen, unchanged
        return
    new = retype(tag, signal)
    assert (new.state_type, new.cold, new.read_only) == expected
    assert new.generation == 3


@pytest.mark.parametrize(("state_type", "generation", "read_only", "task_gen", "expected"), [
    (T.FIXED_PREFIX, 2, False, 2, Reuse.ALLOWED),
    (T.FIXED_PREFIX, 2, True, 2, Reuse.READ_ONLY),  # in-flight task of the old generation
    (T.FIXED_PREFIX, 2, True, 3, Reuse.REFUSED),  # a new task never reuses it
    (T.FIXED_PREFIX, 3, False, 2, Reuse.REFUSED),
    (T.TASK_INPUT, 2, False, 3, Reuse.ALLOWED),
    (T.EVIDENCE, 0, False, 9, Reuse.ALLOWED),
])
def test_reuse_rights(state_type: StateType, generation: int, read_only: bool, task_gen: int,
                      expected: Reuse) -> None:
    tag = TypeTag(state_type=state_type, generation=generation, read_only=read_only)
    assert reuse_for(tag, task_generation=task_gen) is expected


def test_prefix_bump_then_reuse() -> None:
    old = retype(TypeTag(state_type=T.FIXED_PREFIX, generation=1), S.PREFIX_VERSION_BUMP)
    assert reuse_for(old, task_generation=1) is Reuse.READ_ONLY
    assert reuse_for(old, task_generation=2) is Reuse.REFUSED
