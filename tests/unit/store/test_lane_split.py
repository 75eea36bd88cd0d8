"""How a NIXL job is split across lanes (store.transport._nixl.split_job): pure arithmetic."""

from __future__ import annotations

from itertools import pairwise

import pytest

from store.transport import nixl_available

pytestmark = pytest.mark.skipif(not nixl_available(), reason="NIXL is not installed")


@pytest.fixture(scope="module")
def nixl():
    from store.transport import _nixl

    return _nixl


@pytest.mark.parametrize("length", [4 << 20, (9 << 20) + 12_345, 16 << 20, (64 << 20) - 1])
@pytest.mark.parametrize("lanes", [2, 3, 4, 8])
def test_parts_cover_the_job_exactly_page_aligned_one_per_lane(nixl, length, lanes):
    parts = nixl.split_job(length, lanes, tagged=False)
    assert 2 <= len(parts) <= lanes
    assert parts[0][0] == 0 and sum(n for _, n in parts) == length
    for (lo, n), (nxt, _) in pairwise(parts):
        assert lo + n == nxt and lo % 4096 == 0 and n % 4096 == 0
    assert all(n >= nixl.LANE_MIN for _, n in parts[:-1])


@pytest.mark.parametrize(("length", "lanes", "tagged"), [
    ((4 << 20) - 1, 4, False),  # below LANE_FROM
    (16 << 20, 1, False),  # one lane
    (16 << 20, 4, True),  # a tag is one notification after the whole job
])
def test_small_single_lane_and_tagged_jobs_stay_whole(nixl, length, lanes, tagged):
    assert nixl.split_job(length, lanes, tagged) == [(0, length)]
