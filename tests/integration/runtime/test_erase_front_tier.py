"""The API front's part of a tenant erasure, through the service in local mode (real NIXL,
/dev/shm, files and AES-GCM): the front is frozen before anything else happens, so a load
the tenant prepared before the erasure is refused from its first step on; the front's tier
forgets the tenant's prepared loads and counts them on the receipt, zeroes its free
staging slots (each keeps the plaintext of the last page staged in it), and drops the
tenant's cached blinding secret, so the name, provisioned again, shares nothing with the
erased tenant's namespace."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.runtime.records import TenantErased
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture
def service():
    with local_service("agentkv-erase-front-", page_bytes=PAGE, hbm_pages=8,
                       pool_bytes=16 * PAGE) as svc:
        yield svc


class _Watched:
    """The service's controller handle, calling ``on_freeze`` when the erasure freezes the
    tenant there (its first step after the front's freeze, before any key goes)."""

    def __init__(self, inner, on_freeze) -> None:
        self._inner, self._on_freeze = inner, on_freeze

    def freeze_tenant(self, tenant: str) -> None:
        self._on_freeze()
        self._inner.freeze_tenant(tenant)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_a_load_prepared_before_the_erasure_is_refused_from_its_first_step(service) -> None:
    client = service.client("acme")
    session = client.open_session("s")
    keys = session.store_pages([kv_page(i, "evidence", identity("acme", "s", 1000 * i))
                                for i in range(2)])
    prepared = session.prepare_load(keys)
    seen: list[str] = []

    def complete_now() -> None:
        try:
            session.complete_load(prepared["load_id"])
            seen.append("served")
        except RemoteError as exc:
            seen.append(exc.code)

    service.topo.controller = _Watched(service.topo.controller, complete_now)
    receipt = service.erase_tenant("acme")
    assert seen == ["tenant_erased"]  # no byte of its pages left the front meanwhile
    assert receipt.failed_tiers == ()
    client.close()


def test_once_the_keys_are_gone_the_controller_refuses_the_tenant(service) -> None:
    """The front's tier runs after the keys were destroyed: by then the controller takes no
    call of the tenant either (a call that passed the front just before its freeze)."""
    with service.client("acme") as client:
        client.open_session("s").store_pages([kv_page(0, "evidence",
                                                       identity("acme", "s", 0))])
    controller, front_tier = service.topo.controller, service.front.forget_tenant
    seen: list[str] = []

    def forget_tenant(tenant: str) -> int:
        try:
            controller.open_session(tenant, "late")
            seen.append("opened")
        except TenantErased:
            seen.append("refused")
        return front_tier(tenant)

    service.front.forget_tenant = forget_tenant
    receipt = service.erase_tenant("acme")
    assert seen == ["refused"] and receipt.failed_tiers == ()
    assert dict(receipt.counts)["sessions"] == 1  # the late session was never opened


def test_the_front_tier_forgets_loads_scrubs_staging_and_the_blinding_secret(service) -> None:
    client = service.client("acme")
    session = client.open_session("s")
    pages = [kv_page(i, "evidence", identity("acme", "s", 1000 * i)) for i in range(3)]
    keys = session.store_pages(pages)
    session.prepare_load(keys[:1])
    session.prepare_load(keys[1:])  # two loads prepared, neither completed
    marks = [p["data"][4096:4160] for p in pages]
    staged = service.front.mover.staging.tobytes()
    assert any(m in staged for m in marks)  # the case: free slots keep the last bytes staged
    before = service.front.blinder.namespace("acme")
    client.close()
    receipt = service.erase_tenant("acme")
    assert receipt.failed_tiers == ()
    assert dict(receipt.counts)["front"] == 2
    staged = service.front.mover.staging.tobytes()
    assert not any(m in staged for m in marks)
    with service.client("acme") as again:  # the name comes back, empty
        again.open_session("s")
        assert service.front.blinder.namespace("acme") != before
