"""Small builders shared by the policy unit tests."""

from __future__ import annotations

from agentkv_cluster.policy.base import PageView, StateType

MB = 1 << 20


def page(page_id: int, size_mb: float = 1, state_type: StateType = StateType.EVIDENCE,
         **fields: object) -> PageView:
    return PageView(page_id=page_id, size_bytes=int(size_mb * MB), state_type=state_type,
                    **fields)
