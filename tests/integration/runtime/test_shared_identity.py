"""One identity stored by two sessions is one page (``store_pages`` keeps the first copy):
the end of one session's task must not take it from the other."""

from __future__ import annotations

import pytest

from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's size


def test_the_other_session_still_loads_the_page_it_stored() -> None:
    """Regression (found from outside): session A's task end deleted the shared page, and
    session B's load of the key its own store had returned answered ``not_found``."""
    with local_service("agentkv-shared-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=8 * PAGE) as svc, svc.client("acme") as client:
        a, b = client.open_session("A"), client.open_session("B")
        page = kv_page(0, "evidence", identity("acme", "", 0))
        (key,) = a.store_pages([page])
        assert b.store_pages([dict(page, page_id=7)]) == [key]
        a.task_start(event_id=1, task_id="t", version=1, ts=0.0, prefix_generation=1,
                     input_pages=[0])
        assert a.task_end(event_id=2, task_id="t", version=2, ts=1.0)["retired"] == 0
        assert b.load([key]) == [page["data"]]
        b.release([key])
        b.task_start(event_id=1, task_id="u", version=1, ts=0.0, prefix_generation=1,
                     input_pages=[7])
        assert b.task_end(event_id=2, task_id="u", version=2, ts=1.0)["retired"] == 1
        assert svc.stats()["pages"] == 0
