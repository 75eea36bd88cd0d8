"""One tenant cannot hold every connection: it opened ``api.max_connections`` of them,
authenticated and idle (kept 15 min, refreshed at will), and every other tenant was
refused "too many connections". A tenant's authenticated connections now count against
``api.tenant_connections``; over it the call is refused (busy) and that connection
closed, and the connections it still holds, and other tenants', are served."""

from __future__ import annotations

import pytest

from agentkv_cluster.api import protocol as p
from agentkv_cluster.api.client import AgentKvClient
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

MAX, PER_TENANT = 8, 3


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-tconn-", page_bytes=1 << 16, hbm_pages=8, pool_bytes=1 << 20,
                       api={"max_connections": MAX, "tenant_connections": PER_TENANT}) as svc:
        yield svc


def test_a_tenant_over_its_connections_is_refused_and_others_are_served(service) -> None:
    token = service.token("evil")
    held = [AgentKvClient.connect(service.address, token) for _ in range(PER_TENANT)]
    try:
        for client in held:
            client.hello()
        extra = AgentKvClient.connect(service.address, token)
        with pytest.raises(p.RemoteError, match="api.tenant_connections") as err:
            extra.open_session("one-too-many")
        assert err.value.code == "busy"
        extra.close()
        with service.client("bob") as bob:  # another tenant still gets in
            bob.open_session("served").close()
        held[0].open_session("still-served").close()  # and evil's own connections work
        held.pop().close()
        with AgentKvClient.connect(service.address, token) as again:  # a slot came free
            again.open_session("after-close").close()
    finally:
        for client in held:
            client.close()
