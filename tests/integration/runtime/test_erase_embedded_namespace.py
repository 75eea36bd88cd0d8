"""The service's erasure on the embedded directory leaves nothing of the tenant's namespace:
its entries and its generation state go (``delete_namespace`` through the directory's
handle); before, entries went one by one and the namespace's generations stayed."""

from __future__ import annotations

import pytest

from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration
PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry


def test_an_erased_tenants_namespace_leaves_the_embedded_directory() -> None:
    with local_service("agentkv-erase-embedded-", page_bytes=PAGE, hbm_pages=2,
                       pool_bytes=16 * PAGE) as svc:
        spaces = svc.topo.directory.target.inner._spaces
        for tenant in ("acme", "zeta"):
            with svc.client(tenant) as client:
                session = client.open_session("s")
                session.store_pages([kv_page(i, "evidence", identity(tenant, "s", 1000 * i))
                                     for i in range(4)])  # 2 pages go to the pool: published
        before = set(spaces)
        assert len(before) == 2
        receipt = svc.erase_tenant("acme")
        assert dict(receipt.counts)["directory"] >= 1
        left = set(spaces)
        assert len(left) == 1 and left < before  # zeta's alone
