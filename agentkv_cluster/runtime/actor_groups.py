"""Ray concurrency groups of the service's actors: calls that must never wait behind others.

An actor runs its calls on ``max_concurrency`` threads. Two kinds of call must not queue
behind a full set of them (Ray Serve gives its health checks their own group the same way):

- ``HEALTH``: ``ping``. The controller's watcher takes an actor that does not answer a ping
  within seconds for dead and forgets it; under a burst of work a busy actor used to be
  forgotten alive (``agentkv demo --sessions 600``: every later call answered ``KeyError``).
- ``MOVE_OUT``: the HBM actor's calls that free arena pages (``drop``, ``demote`` and the
  like). A new page waits for a free arena page (``HbmActor._alloc``); when every thread
  waited so, the drops that would free one queued behind them until each wait gave up with
  ``ArenaFull``.
- ``STOP``: ``close``. The controller's ``close`` ends the waits of loads blocked for room;
  behind a full set of such loads it would wait for their deadlines itself.

``group`` marks a method; ``remote_class`` makes an actor class remote with ``GROUPS`` and
puts its ``ping`` in ``HEALTH`` and its ``close`` in ``STOP``. In local mode (no Ray) the marks are inert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., object])

HEALTH = "health"
MOVE_OUT = "move_out"
STOP = "stop"
GROUPS = {HEALTH: 1, MOVE_OUT: 4, STOP: 1}
OWN_GROUP = {"ping": HEALTH, "close": STOP}  # methods ``remote_class`` groups by name


def group(name: str) -> Callable[[F], F]:
    """Run the decorated actor method in concurrency group ``name`` (one of ``GROUPS``)."""
    if name not in GROUPS:
        raise ValueError(f"unknown concurrency group {name!r}; known: {sorted(GROUPS)}")

    def mark(method: F) -> F:
        try:
            import ray
        except ImportError:  # local mode only: nothing to group
            return method
        return ray.method(concurrency_group=name)(method)

    return mark


def remote_class(cls: type) -> Any:
    """``cls`` as a Ray actor class with these groups (what ``wiring`` spawns); its ``ping``
    (every actor of the service has one) is a health check and runs in ``HEALTH``, its
    ``close`` in ``STOP`` (``OWN_GROUP``), unless marked otherwise."""
    import ray

    for name, own in OWN_GROUP.items():
        method = getattr(cls, name, None)
        if method is not None and getattr(method, "__ray_concurrency_group__", None) is None:
            ray.method(concurrency_group=own)(method)
    return ray.remote(concurrency_groups=dict(GROUPS))(cls)
