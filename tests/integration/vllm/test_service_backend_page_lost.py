"""The connector's service backend when the service lost a block (``page_lost``: its only
copy died with an HBM actor): a miss that vLLM recomputes, the block's key forgotten so a
later save stores it again, and the service not marked down. It used to surface as
``BackendUnavailable`` ("load failed"), counted as a backend error, with the key kept, so
the worker never saved the block again and every later load of it failed the same way.

The service runs in this process (local mode); its front refuses the load as the real
front refuses a page with no copy left (``api.errors.PageLost``, on the wire
``page_lost``), which a local service with its one HBM actor cannot lose for real (that
is ``tests/integration/runtime/test_store_outlives_hbm_death.py``)."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.errors import PageLost
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from tests.integration.vllm.test_backend_contract import TOKENS, _ids, _page
from tests.integration.vllm.test_service_backend_recovery import Live

pytestmark = pytest.mark.integration


class _Losing:
    """The service's own front, refusing every load as lost while ``lost`` is set."""

    def __init__(self, inner: object) -> None:
        self.inner, self.lost = inner, False

    def prepare_load(self, principal: object, session: str, keys: list[bytes]) -> dict:
        if self.lost:
            raise PageLost("PageLost: 1 page(s) have no copy left; re-prefill them")
        return self.inner.prepare_load(principal, session, keys)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.fixture
def live():
    env = Live()
    yield env
    env.close()


def test_a_block_the_service_lost_is_a_miss_saved_again(live) -> None:
    backend = live.backend
    front = _Losing(live.svc.server.backend)
    live.svc.server.backend = front
    caller = backend.resolve(live.svc.token("acme"), "agent-lost")
    backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
    ident = _ids(TOKENS, "acme", 1)[0]
    page = _page(ident, 7)
    backend.put(caller, ident, page)
    assert backend.get(caller, ident) == page
    front.lost = True
    assert backend.get(caller, ident) is None  # a miss: vLLM recomputes the block
    assert not backend.contains(caller, ident)  # so the worker saves it again
    assert backend.outages == 0  # the service is not marked down for it
    front.lost = False
    backend.put(caller, ident, page)
    assert backend.contains(caller, ident) and backend.get(caller, ident) == page
