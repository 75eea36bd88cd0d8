"""Retrying one directory step while its backing service is unreachable, within a time budget.

For a step that must finish across a short outage (a Redis restart, a failover), such as
deleting an erased tenant's namespace. Only ``DirectoryUnavailable`` is retried, and not
``CredentialsRefused`` (a refused password does not heal by waiting); every other error,
and the last ``DirectoryUnavailable`` once the next wait would end past the budget, is
raised as it is. The caller gives the delays (``next_delay``: the delay after the previous
one, None at the first failure), so every caller can share one backoff; clock and sleep
are passed in, so the loop is tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from store.directory.base import CredentialsRefused, DirectoryUnavailable

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryWait:
    """One wait before the next attempt: why the last one failed, how long the wait is,
    and how long the step has run since its first attempt, out of its budget."""

    error: DirectoryUnavailable
    attempt: int  # attempts made so far (1: the first one failed)
    delay_s: float
    elapsed_s: float
    budget_s: float


def retry_unavailable(step: Callable[[], T], *, budget_s: float,
                      next_delay: Callable[[float | None], float],
                      on_wait: Callable[[RetryWait], object] = lambda _wait: None,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], object] = time.sleep) -> T:
    """``step()``'s result, trying again after each ``DirectoryUnavailable`` while the wait
    ends within ``budget_s`` of the first attempt (``budget_s`` 0: one attempt). Each wait
    is told to ``on_wait`` before it starts."""
    start = clock()
    delay: float | None = None
    attempt = 0
    while True:
        attempt += 1
        try:
            return step()
        except CredentialsRefused:
            raise
        except DirectoryUnavailable as exc:
            delay = next_delay(delay)
            now = clock()
            if now + delay > start + budget_s:
                raise
            on_wait(RetryWait(error=exc, attempt=attempt, delay_s=delay,
                              elapsed_s=now - start, budget_s=budget_s))
            sleep(delay)
