"""The one handle wrapper: every ``.remote()`` and ``ray.get`` of the service lives here.

A ``Handle`` calls methods of a Ray actor or, in local mode (tests, tools), of a
plain object, with one syntax: ``handle.method(*args)``. A dead actor surfaces as
``ActorGone``; an exception raised inside the actor is re-raised as itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class ActorGone(Exception):
    """The actor behind a handle died or cannot be reached."""


class Handle:
    """A picklable reference to an actor (or a local object) plus its service name."""

    def __init__(self, target: Any, name: str, *, remote: bool) -> None:
        self.target = target
        self.name = name
        self.remote = remote

    def call(self, method: str, *args: Any, timeout_s: float | None = 120.0) -> Any:
        if not self.remote:
            return getattr(self.target, method)(*args)
        return self._get(getattr(self.target, method).remote(*args), timeout_s)

    def start(self, method: str, *args: Any, timeout_s: float | None = 120.0
              ) -> Callable[[], Any]:
        """Send a call now and return a function that waits for its result (or raises what
        ``call`` would): the caller overlaps the call with other work."""
        if not self.remote:
            try:
                value = getattr(self.target, method)(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the waiter, as remotely
                error = exc

                def fail() -> Any:
                    raise error

                return fail
            return lambda: value
        return functools.partial(self._get, getattr(self.target, method).remote(*args),
                                 timeout_s)

    def _get(self, ref: Any, timeout_s: float | None) -> Any:
        import ray
        from ray import exceptions as rex

        try:
            return ray.get(ref, timeout=timeout_s)
        except rex.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None  # the actor's own exception, message intact
            raise exc.as_instanceof_cause() from None
        except (rex.RayActorError, rex.ActorUnavailableError) as exc:
            raise ActorGone(f"{self.name}: {type(exc).__name__}") from None
        except rex.GetTimeoutError as exc:
            raise ActorGone(f"{self.name}: no answer in {timeout_s} s") from exc

    def fire(self, method: str, *args: Any) -> None:
        """Call without waiting for the result (errors are dropped)."""
        if self.remote:
            getattr(self.target, method).remote(*args)
        else:
            getattr(self.target, method)(*args)

    def alive(self, timeout_s: float = 10.0) -> bool:
        try:
            self.call("ping", timeout_s=timeout_s)
            return True
        except ActorGone:
            return False

    def kill(self) -> None:
        """Fault injection and shutdown: end the actor process now."""
        if self.remote:
            import ray

            ray.kill(self.target, no_restart=True)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return functools.partial(self.call, method)

    def __repr__(self) -> str:
        return f"Handle({self.name!r}, remote={self.remote})"


def create(remote_cls: Any, name: str, options: dict[str, Any], *args: Any) -> Handle:
    """Start an actor from a class made remote by ``wiring``; waits until it is constructed."""
    actor = remote_cls.options(**options).remote(*args)
    handle = Handle(actor, name, remote=True)
    handle.call("ping", timeout_s=300.0)
    return handle


def local(obj: Any, name: str) -> Handle:
    return Handle(obj, name, remote=False)
