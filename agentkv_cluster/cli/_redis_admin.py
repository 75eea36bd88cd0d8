"""Admin-side Redis connections for the CLI (the one CLI module that imports redis)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from agentkv_cluster.cli import CliError, redact_url
from store.directory.base import InvalidEntry, check_namespace


def connect_admin(url: str) -> Any:
    """An admin client for ``url`` (per-tenant clients: ``cli.audit.tenant_connector``);
    an error names the server with its password masked."""
    try:
        admin = redis.Redis.from_url(url)
        admin.ping()
    except (redis.RedisError, ValueError) as exc:
        shown = redact_url(url)
        raise CliError(f"cannot reach Redis at {shown}: {str(exc).replace(url, shown)}") from None
    return admin


def namespace_deleter(url: str, namespace: str, prefix: str = "akv") -> Callable[[object], int]:
    """A tier deleter for the eraser: drops every directory key of one tenant namespace
    (``prefix``: the service's ``directory.prefix``) with the directory's own
    ``delete_namespace``, as the running service's erasure does; counts entries removed."""
    from store.directory.redis_backend import RedisDirectory

    try:  # it goes into a SCAN pattern: a glob character would match other keys
        check_namespace(prefix)
    except InvalidEntry as exc:
        raise CliError(f"--redis-prefix {prefix!r:.40}: {exc}") from None
    directory = RedisDirectory(url, prefix=prefix)

    def delete(scope: object) -> int:
        try:
            return directory.delete_namespace(namespace)
        finally:
            directory.close()

    return delete
