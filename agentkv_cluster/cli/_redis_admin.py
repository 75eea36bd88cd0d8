"""Admin-side Redis connections for the CLI (the one CLI module that imports redis)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection
from typing import Any

import redis

from agentkv_cluster.cli import CliError, redact_url
from store.directory.base import InvalidEntry, check_namespace


def connect_admin(url: str) -> Any:
    """An admin client for ``url`` (per-tenant clients: ``cli.audit.tenant_connector``);
    an error names the server with its password masked."""
    from store.directory.base import WritesRefused
    from store.directory.redis_errors import as_directory_error

    try:
        admin = redis.Redis.from_url(url)
        admin.ping()
    except (redis.RedisError, ValueError) as exc:
        shown = redact_url(url)
        detail = str(exc).replace(url, shown)
        refused = as_directory_error(exc) if isinstance(exc, redis.RedisError) else exc
        if isinstance(refused, WritesRefused):  # ``MISCONF`` refuses PING too: it answered
            raise CliError(f"Redis at {shown} answers but refuses writes "
                           f"({refused.reason.value}: {detail}); run this again once it "
                           "accepts writes") from None
        raise CliError(f"cannot reach Redis at {shown}: {detail}") from None
    return admin


def check_prefix(prefix: str) -> None:
    """``--redis-prefix``: it goes into SCAN patterns, where a glob character would match
    other keys."""
    try:
        check_namespace(prefix)
    except InvalidEntry as exc:
        raise CliError(f"--redis-prefix {prefix!r:.40}: {exc}") from None


def check_url(url: str) -> None:
    """``--redis-url`` parses as a Redis URL (scheme, port, database): checked before any
    step that a malformed URL would cut off half way."""
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:  # not a redis://, rediss:// or unix:// URL; a bad port
        shown = redact_url(url)
        raise CliError(f"--redis-url {shown!r}: {str(exc).replace(url, shown)}") from None


def check_credentials(url: str, flag: str, timeout_s: float = 2.0) -> None:
    """A Redis at ``url`` that answers but refuses its credentials (a wrong user or
    password, none where one is required) is a one-line error naming ``flag``: waiting
    does not mend it, and ``serve`` would run local-only and retry for ever as if Redis
    were down. One that cannot be reached passes (the outage the service rides out)."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                      socket_connect_timeout=timeout_s)
    except ValueError:  # not a URL redis-py takes: config checks and the probe say so
        return
    try:
        client.ping()
    except (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError) as exc:
        shown = redact_url(url)
        why = (f"refuses its credentials ({str(exc).replace(url, shown)})"
               if client.connection_pool.connection_kwargs.get("password") else
               "requires a password and the URL gives none")
        raise CliError(f"{flag} {shown}: Redis {why}; give the user and password it accepts "
                       "in the URL") from None
    except (redis.RedisError, OSError):  # unreachable, or refusing something else: the
        return  # service's directory watch reports and retries it
    finally:
        client.close()


def erase_namespace(url: str, namespace: str, prefix: str = "akv", *, retry_s: float,
                    finishing: bool = False) -> int:
    """The directory step of ``tenant erase --redis-url``: every directory key of one tenant
    namespace dropped (``prefix``: the service's ``directory.prefix``) with the directory's
    own ``delete_namespace``, as the running service's erasure does; the number of entries
    removed. An unreachable Redis is retried as the service's erasure retries it (the same
    backoff, for ``retry_s``), each wait told on stderr; the tenant erasure runs this
    before it destroys any key, so a failure here (a ``CliError`` saying so) leaves the
    keys intact and the same command run again completes the erasure. ``finishing``: the
    step of an erasure that destroyed the keys already (cut off before its end), which the
    messages say instead."""
    from agentkv_cluster.runtime.directory_glue import GUARD_BACKOFF
    from store.directory.base import (
        CredentialsRefused,
        DirectoryError,
        DirectoryUnavailable,
        WritesRefused,
    )
    from store.directory.redis_backend import RedisDirectory
    from store.directory.retry import RetryWait, retry_unavailable

    check_prefix(prefix)
    shown = redact_url(url)
    try:
        directory = RedisDirectory(url, prefix=prefix)
    except ValueError as exc:  # not a redis://, rediss:// or unix:// URL
        raise CliError(f"--redis-url {shown!r}: {str(exc).replace(url, shown)}") from None

    state = ("its keys are gone already; its directory entries are not deleted yet"
             if finishing else "nothing erased yet")
    keys = ("its keys were destroyed by the erasure this finishes" if finishing
            else "its keys are intact")

    def told(wait: RetryWait) -> None:
        print(f"agentkv tenant erase: Redis at {shown} is unreachable "
              f"({str(wait.error).replace(url, shown)}); {state}; retrying in "
              f"{wait.delay_s:.1f} s ({wait.elapsed_s:.1f} s of --retry-s "
              f"{wait.budget_s:g} spent)", file=sys.stderr, flush=True)

    try:
        return retry_unavailable(lambda: directory.delete_namespace(namespace),
                                 budget_s=retry_s, next_delay=GUARD_BACKOFF.after, on_wait=told)
    except DirectoryError as exc:
        detail = str(exc).replace(url, shown)
        if isinstance(exc, WritesRefused):
            why, until = f"refuses writes ({exc.reason.value}: {detail})", "it accepts writes"
        elif isinstance(exc, DirectoryUnavailable) and not isinstance(exc, CredentialsRefused):
            why = f"could not be reached within --retry-s {retry_s:g} ({detail})"
            until = "Redis answers"
        else:
            why, until = f"refused the erasure ({type(exc).__name__}: {detail})", "that is fixed"
        raise CliError(f"Redis at {shown} {why}: the tenant was not erased: {keys}, and its "
                       "directory entries were not deleted, or only some of them; run the "
                       f"same command again once {until}") from None
    finally:
        directory.close()


def drop_tenant_user(url: str, namespace: str) -> None:
    """The Redis ACL user that the service made for a tenant namespace (``akv-<ns>``,
    ``runtime.redis_users``) deleted, its open connections with it.
    Part of ``tenant erase --redis-url``, after the namespace's keys went: an erasure
    leaves the tenant no way into Redis. A Redis that refuses it (no ACL rights) is told
    on stderr and the erasure goes on; the service deletes the user, with its
    credentials file, when it next starts."""
    from security.redis_acl import make_user, remove_users

    try:
        admin = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        try:
            remove_users(admin, [make_user(namespace)])  # the service's own naming rule
        finally:
            admin.close()
    except redis.RedisError as exc:
        shown = redact_url(url)
        print(f"agentkv tenant erase: Redis at {shown} did not delete the tenant's user "
              f"({str(exc).replace(url, shown)}); the service deletes it, with its "
              "credentials file, when it next starts", file=sys.stderr, flush=True)


def keys_by_namespace(admin: Any, prefix: str, namespaces: Collection[str]) -> Counter[str]:
    """How many directory keys (``{prefix}:{<ns>}:*``: entries, counts, ``meta``...) each of
    ``namespaces`` holds, in one SCAN of the directory's namespaced keys."""
    check_namespace(prefix)
    wanted, found = set(namespaces), Counter[str]()
    start = len(prefix) + 2  # past "{prefix}:{"
    for key in admin.scan_iter(match=f"{prefix}:{{n*", count=1000):
        ns = key[start:].partition(b"}")[0].decode("ascii", "replace")
        if ns in wanted:
            found[ns] += 1
    return found
