"""Start a small in-process AgentKV service for the agent example (``--service``)."""

from __future__ import annotations

from typing import Any


def start_local_service(tenant: str, *, ray: bool) -> tuple[Any, Any]:
    """The service (controller, HBM and pool actors, directory, wire server) and a client
    for ``tenant``: on a local Ray with ``ray``, else with every actor in this process.
    It listens on a free port, so a running `agentkv serve` (port 7420) is no obstacle."""
    from agentkv_cluster.config import load_config
    from agentkv_cluster.runtime.service import Service

    config = load_config(env={}, overrides={"api": {"port": 0}})
    service = Service(config).start(local=not ray)
    return service, service.client(tenant)
