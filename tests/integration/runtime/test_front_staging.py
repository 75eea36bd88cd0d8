"""Staging slots taken for a store or a load are all given back when taking one of them
timed out: the slots taken before it were kept for good, so each timeout under overload
shrank the front's staging until every store and load failed (found by review). A real
front (local service)."""

from __future__ import annotations

import pytest

from agentkv_cluster.runtime.mover import StagingFull
from tests.integration.runtime.test_public_mark import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def test_slots_taken_before_a_timeout_are_given_back() -> None:
    with local_service("agentkv-staging-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=4 * PAGE) as service:
        front = service.front
        mover = front.mover
        free = len(mover._free)
        real, calls = mover.take_slot, []

        def take_slot(timeout_s: float = 10.0) -> int:
            calls.append(timeout_s)
            if len(calls) == 3:
                raise StagingFull("no staging slot free")
            return real(timeout_s)

        mover.take_slot = take_slot
        try:
            with pytest.raises(StagingFull), front._staged(4):
                pass
        finally:
            del mover.take_slot
        assert len(calls) == 3 and len(mover._free) == free
