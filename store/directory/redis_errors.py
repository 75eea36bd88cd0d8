"""How the Redis directory's failures become directory errors (one place for the mapping).

Redis's own refusals map by the reply's error prefix, which redis-py turns into a class
(``OOM``, ``READONLY``, ``NOPERM``, a refused ``AUTH``) or leaves at the head of the message
(``MISCONF``, which it has no class for); never by words deeper in the message, where a
script's name or an argument could put them. The refusals of every write (``OOM``,
``READONLY``, ``MISCONF``) are ``WritesRefused``, one class per ``WriteRefusal``. The
scripts' refusals map by their ``AKV_<KIND>`` tag (``_lua``). Anything else is a plain
``DirectoryError`` with Redis's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from redis import exceptions as rexc

from store.directory.base import (
    CredentialsRefused,
    DirectoryAccessDenied,
    DirectoryError,
    DirectoryFull,
    DirectoryUnavailable,
    EntryInUse,
    GenerationRegression,
    MissingEntry,
    PersistenceFailing,
    ReadOnlyGeneration,
    ReadOnlyReplica,
    RefcountUnderflow,
    UnknownGeneration,
)

SCRIPT_ERRORS: dict[str, type[DirectoryError]] = {
    "AKV_READONLY": ReadOnlyGeneration,
    "AKV_UNKNOWN_GEN": UnknownGeneration,
    "AKV_REGRESSION": GenerationRegression,
    "AKV_IN_USE": EntryInUse,
    "AKV_UNDERFLOW": RefcountUnderflow,
    "AKV_MISSING": MissingEntry,
}
# What ``call`` translates; any other redis-py error (a client-side bug) is raised as it is.
MAPPED = (rexc.ConnectionError, rexc.TimeoutError, rexc.ResponseError)
T = TypeVar("T")


def as_directory_error(exc: Exception) -> Exception:
    """The directory error for a Redis failure of ``MAPPED``; anything else as it is."""
    if not isinstance(exc, MAPPED):
        return exc
    if isinstance(exc, rexc.AuthenticationError):  # a ConnectionError in redis-py: test it first
        return CredentialsRefused(f"redis refused the credentials: {exc}")
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError)):
        return DirectoryUnavailable(f"redis unreachable: {exc}")
    if isinstance(exc, rexc.NoPermissionError):
        return DirectoryAccessDenied(str(exc))
    if isinstance(exc, rexc.OutOfMemoryError):  # a write refused at maxmemory, script or not
        return DirectoryFull(f"redis refuses writes, out of memory: {exc}")
    if isinstance(exc, rexc.ReadOnlyError):  # a replica, or a primary demoted in a failover
        return ReadOnlyReplica(f"redis refuses writes, read-only replica: {exc}")
    message = str(exc)
    if message.split(" ", 1)[0] == "MISCONF":  # no class in redis-py: the prefix stays put
        return PersistenceFailing(f"redis refuses writes, persistence failing: {message}")
    for tag, error in SCRIPT_ERRORS.items():
        if tag in message:
            return error(message.split(tag, 1)[1].strip())
    if message.startswith("NOPERM"):
        return DirectoryAccessDenied(message)
    return DirectoryError(message)


def call(fn: Callable[[], T]) -> T:
    """Run one Redis call, translating its failures into directory errors."""
    try:
        return fn()
    except MAPPED as exc:
        error = as_directory_error(exc)
        if isinstance(error, tuple(SCRIPT_ERRORS.values())):
            raise error from None  # the script's own refusal: Redis's frame adds nothing
        raise error from exc
