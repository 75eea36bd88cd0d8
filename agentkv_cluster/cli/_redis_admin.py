"""Admin-side Redis connections for the CLI (the one CLI module that imports redis)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from agentkv_cluster.cli import CliError
from store.directory.base import InvalidEntry, check_namespace


def connect_admin(url: str) -> tuple[Any, Callable[[str, str], Any]]:
    """An admin client for ``url`` and a factory for per-tenant clients on the same server."""
    try:
        admin = redis.Redis.from_url(url)
        admin.ping()
    except (redis.RedisError, ValueError) as exc:
        raise CliError(f"cannot reach Redis at {url}: {exc}") from None
    kwargs = admin.connection_pool.connection_kwargs
    host, port = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379)

    def connect(username: str, password: str) -> Any:
        return redis.Redis(host=host, port=port, username=username, password=password)

    return admin, connect


def namespace_deleter(url: str, namespace: str, prefix: str = "akv") -> Callable[[object], int]:
    """A tier deleter for the eraser: drops every directory key of one tenant namespace
    (``prefix``: the service's ``directory.prefix``)."""
    try:  # it goes into a SCAN pattern: a glob character would match other keys
        check_namespace(prefix)
    except InvalidEntry as exc:
        raise CliError(f"--redis-prefix {prefix!r:.40}: {exc}") from None
    admin = redis.Redis.from_url(url)

    def delete(scope: object) -> int:
        keys = list(admin.scan_iter(match=f"{prefix}:{{{namespace}}}:*", count=1000))
        return int(admin.delete(*keys)) if keys else 0

    return delete
