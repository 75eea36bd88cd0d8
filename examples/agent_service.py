"""The agent example through a real AgentKV service: pages and events over the client.

`ServicePageStore` is the engine adapter's `PageStore` over the wire protocol:
`store_pages` after a model call, `load` (prepare + complete) on restore, `release`
at task end. The service keys pages by their (blinded) identity and picks their tier
and form itself, so only the full-precision form is sent.
"""

from __future__ import annotations

from typing import Any

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.types import Lookup


class ServicePageStore:
    """A `PageStore` whose pages live in the AgentKV service (one session)."""

    def __init__(self, session: Any) -> None:  # agentkv_cluster.api.client.SessionClient
        self._session = session
        self._keys: dict[bytes, bytes] = {}  # adapter key -> service key

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity) -> None:
        if key in self._keys:
            return
        page = {"identity": identity.pack(), "data": bytes(data),
                "page_id": int.from_bytes(key[:7], "big"), "state_type": "temp_reasoning"}
        self._keys[key] = self._session.store_pages([page])[0]

    def get(self, key: bytes) -> tuple[Lookup, bytes | None]:
        service_key = self._keys.get(key)
        if service_key is None:
            return Lookup.MISS, None
        try:
            return Lookup.HIT, self._session.load([service_key])[0]
        except RemoteError as exc:
            if exc.code != "not_found":
                raise
            return Lookup.MISS, None  # evicted or retired: the adapter recomputes

    def delete(self, key: bytes) -> None:
        service_key = self._keys.pop(key, None)
        if service_key is None:
            return
        try:
            self._session.release([service_key])
        except RemoteError as exc:
            if exc.code != "not_found":  # already retired (e.g. by TASK_END) is fine
                raise

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys


def start_local_service(tenant: str) -> tuple[Any, Any]:
    """A small in-process service (Ray, host pool, embedded directory) and a client."""
    from agentkv_cluster.config import AgentKvConfig
    from agentkv_cluster.runtime.service import Service

    service = Service(AgentKvConfig()).start()
    return service, service.client(tenant)
