"""``store_pages``'s ``structured`` field reaches the risk controller (docs/protocol.md): a
page that feeds code or JSON output is marked on the service's page record, a malformed
flag is ``bad_args`` with nothing stored, and a page stored again with the flag is marked
too (and the pool copies made of it from then on: ``test_structured_copies.py`` in
``tests/integration/runtime``). That such a page is never demoted lossy is
``tests/unit/service/test_structured_pages.py``."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-structured-", page_bytes=1 << 17, hbm_pages=8,
                       pool_bytes=4 << 20) as svc:
        yield svc


def _flags(svc) -> dict[int, bool]:
    """Per page id of session ``s``, whether its record is marked structured: for the
    policy (its view) and for the copies the pool stores of it (its meta) alike."""
    table = svc.topo.controller.target.controller.manager.table  # local mode: the actor
    records = [r for r in table.pages.values() if r.meta.session == "s"]
    assert all(r.meta.structured == r.view.produces_structured for r in records)
    return {r.meta.page_id: r.view.produces_structured for r in records}


def test_the_flag_reaches_the_page_record_and_bad_flags_are_refused(service) -> None:
    with service.client("acme") as client:
        s = client.open_session("s")
        for bad in (1, "yes", None):
            page = kv_page(9, "temp_reasoning", identity("acme", "s", 9000)) | {"structured": bad}
            with pytest.raises(RemoteError) as err:
                s.store_pages([page])
            assert err.value.code == "bad_args" and "structured" in err.value.message
        pages = [kv_page(i, "temp_reasoning", identity("acme", "s", 1000 * i)) for i in range(3)]
        pages[1]["structured"] = True
        pages[2]["structured"] = False
        s.store_pages(pages)
        assert _flags(service) == {0: False, 1: True, 2: False}  # page 9 was never stored


def test_a_page_stored_again_with_the_flag_is_marked(service) -> None:
    with service.client("acme") as client:
        s = client.open_session("s")
        ident = identity("acme", "s", 5000)
        s.store_pages([kv_page(5, "temp_reasoning", ident)])
        assert _flags(service)[5] is False
        s.store_pages([kv_page(5, "temp_reasoning", ident) | {"structured": True}])
        assert _flags(service)[5] is True
