"""State types of paper Table 1, their default policies, and type transitions.

Types come only from protocol boundaries (system-prompt boundary, tool-call
protocol, message role, orchestrator), never from reading hidden reasoning.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import NewType

PageId = NewType("PageId", int)
NodeId = NewType("NodeId", int)


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A session as the service tells sessions apart: its tenant and its name (two
    tenants may both name a session "main"; they are two sessions)."""

    tenant: str
    session: str


class StateType(enum.Enum):
    """The seven semantic types of a state page (Table 1)."""

    FIXED_PREFIX = "fixed_prefix"
    TASK_INPUT = "task_input"
    EVIDENCE = "evidence"
    TOOL_OBSERVATION = "tool_observation"
    VERIFIED_RESULT = "verified_result"
    TEMP_REASONING = "temp_reasoning"
    FAILED_BRANCH = "failed_branch"


@dataclass(frozen=True, kw_only=True)
class TypeDefaults:
    """Per-type priors the value model and the risk controller start from."""

    reuse_prob: float  # prior p_reuse before the predictor has data
    recompute_weight: float  # relative C_recomp
    correctness_weight: float  # Q_i: impact on structured output / code correctness
    keep_reference: bool  # keep a full-precision reference copy in a lower tier
    keep_recompute_entry: bool  # keep token ids so the page can be re-prefilled
    prefetch_in_gaps: bool  # worth prefetching back before a tool returns
    source: str
    end_of_life: str
    policy: str


TYPE_DEFAULTS: Mapping[StateType, TypeDefaults] = MappingProxyType(
    {
        StateType.FIXED_PREFIX: TypeDefaults(
            reuse_prob=0.99, recompute_weight=0.60, correctness_weight=0.70,
            keep_reference=True, keep_recompute_entry=True, prefetch_in_gaps=True,
            source="system prompt, tool schema",
            end_of_life="session/tenant version change",
            policy="shared across turns; high precision or stable low-bit",
        ),
        StateType.TASK_INPUT: TypeDefaults(
            reuse_prob=0.85, recompute_weight=0.50, correctness_weight=0.60,
            keep_reference=False, keep_recompute_entry=True, prefetch_in_gaps=True,
            source="user goal, constraints",
            end_of_life="task end or goal rewritten",
            policy="resident while active; demote after branch switch",
        ),
        StateType.EVIDENCE: TypeDefaults(
            reuse_prob=0.70, recompute_weight=0.85, correctness_weight=0.50,
            keep_reference=True, keep_recompute_entry=False, prefetch_in_gaps=True,
            source="retrieved docs, code snippets",
            end_of_life="all dependent nodes committed",
            policy="high recompute cost; keep a reversible copy first",
        ),
        StateType.TOOL_OBSERVATION: TypeDefaults(
            reuse_prob=0.75, recompute_weight=0.70, correctness_weight=0.50,
            keep_reference=False, keep_recompute_entry=False, prefetch_in_gaps=True,
            source="search / DB / compiler output",
            end_of_life="superseded or committed",
            policy="short-term high value; prefetch in tool gaps",
        ),
        StateType.VERIFIED_RESULT: TypeDefaults(
            reuse_prob=0.80, recompute_weight=1.00, correctness_weight=1.00,
            keep_reference=True, keep_recompute_entry=True, prefetch_in_gaps=True,
            source="test passed, computation confirmed",
            end_of_life="downstream nodes finished",
            policy="high correctness weight; never irreversibly deleted early",
        ),
        StateType.TEMP_REASONING: TypeDefaults(
            reuse_prob=0.45, recompute_weight=0.30, correctness_weight=0.30,
            keep_reference=False, keep_recompute_entry=True, prefetch_in_gaps=False,
            source="candidate plans, drafts",
            end_of_life="branch committed or timeout",
            policy="mixed-precision compression; keep recompute entry",
        ),
        StateType.FAILED_BRANCH: TypeDefaults(
            reuse_prob=0.12, recompute_weight=0.10, correctness_weight=0.05,
            keep_reference=False, keep_recompute_entry=False, prefetch_in_gaps=False,
            source="invalid action, error path",
            end_of_life="failure confirmed",
            policy="low priority retirement; keep audit summary only",
        ),
    }
)


class TypeSignal(enum.Enum):
    """Protocol-boundary signals that change a page's type or reuse rights."""

    SUPERSEDED = "superseded"  # a newer observation replaces this one
    VERIFIED = "verified"  # an external test passed
    BRANCH_FAILED = "branch_failed"  # rollback confirmed the branch failed
    PREFIX_VERSION_BUMP = "prefix_version_bump"  # system prompt / tool schema changed


class UnknownPage(KeyError):
    """A page id that the state machine or the event graph does not track."""


class IllegalTypeTransition(ValueError):
    """A signal that does not apply to the page's current type."""


class Reuse(enum.Enum):
    """May a task read this page?"""

    ALLOWED = "allowed"
    READ_ONLY = "read_only"  # old prefix generation, for tasks already in flight
    REFUSED = "refused"


@dataclass(frozen=True, kw_only=True)
class TypeTag:
    """A page's semantic type plus the flags its transitions set."""

    state_type: StateType
    generation: int = 0  # prefix generation the page was built under
    cold: bool = False  # superseded: no longer short-term valuable
    read_only: bool = False  # old prefix generation

    @property
    def defaults(self) -> TypeDefaults:
        return TYPE_DEFAULTS[self.state_type]


# what a rollback turns into failed branch (a verified result stays verified)
FAILABLE_TYPES = frozenset(
    {StateType.TEMP_REASONING, StateType.TOOL_OBSERVATION, StateType.EVIDENCE}
)


def retype(tag: TypeTag, signal: TypeSignal) -> TypeTag:
    """Apply a signal; raises ``IllegalTypeTransition`` if it does not apply."""
    t = tag.state_type
    if signal is TypeSignal.SUPERSEDED and t is StateType.TOOL_OBSERVATION:
        return replace(tag, cold=True)
    if signal is TypeSignal.VERIFIED and t is StateType.TEMP_REASONING:
        return replace(tag, state_type=StateType.VERIFIED_RESULT, cold=False)
    if signal is TypeSignal.BRANCH_FAILED and t in FAILABLE_TYPES:
        return replace(tag, state_type=StateType.FAILED_BRANCH, cold=True)
    if signal is TypeSignal.PREFIX_VERSION_BUMP and t is StateType.FIXED_PREFIX:
        return replace(tag, read_only=True)
    raise IllegalTypeTransition(f"{signal.value} does not apply to a {t.value} page")


def reuse_for(tag: TypeTag, *, task_generation: int) -> Reuse:
    """Reuse rights of a task that started under prefix ``task_generation``.

    An old-generation prefix keeps serving tasks already in flight under it
    (read-only) and is never reused by tasks started under a newer generation.
    """
    if tag.state_type is not StateType.FIXED_PREFIX:
        return Reuse.ALLOWED
    if task_generation == tag.generation:
        return Reuse.READ_ONLY if tag.read_only else Reuse.ALLOWED
    return Reuse.REFUSED
