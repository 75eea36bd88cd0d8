"""The controller's plain state records and its one error (shared by its two halves)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentkv_cluster.policy.base import EvictionPolicy, GapPlan


class HbmFull(Exception):
    """Pinned pages alone fill the HBM actor: nothing can be admitted or restored."""


@dataclass(slots=True)
class HbmBudget:
    capacity: int
    policy: EvictionPolicy
    used: int = 0
    sessions: int = 0


@dataclass(slots=True)
class SessionState:
    hbm: str
    pages: set[int] = field(default_factory=set)
    tools: dict[str, tuple[str, float, GapPlan | None]] = field(default_factory=dict)
    pinned: dict[int, float] = field(default_factory=dict)  # gid -> when this session pinned it
