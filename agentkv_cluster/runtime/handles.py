"""The handle machinery: every ``.remote()`` and ``ray.get`` of the service lives here.

``ActorHandle`` calls methods of a Ray actor or, in local mode (tests, tools), of a
plain object. It has no catch-all: each actor kind has a typed subclass
(``actor_handles.PoolHandle``, ``HbmHandle``, ``ControllerHandle``,
``DirectoryHandle``, in the style of Ray Serve's ``DeploymentHandle``) whose methods
carry the actor's parameter and return types, so a misspelt method is an
``AttributeError`` where it is called, not a failure inside the actor. A dead actor
surfaces as ``ActorGone``; an exception raised inside the actor is re-raised as itself.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, Self

DEFAULT_TIMEOUT_S = 120.0  # how long a call waits for its answer unless ``options`` says
CREATE_TIMEOUT_S = 300.0  # how long ``create`` waits for the actor to be constructed


class ActorGone(Exception):
    """The actor behind a handle died or cannot be reached."""


class ActorHandle:
    """A picklable reference to an actor (or a local object) plus its service name."""

    def __init__(self, target: Any, name: str, *, remote: bool,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self.name = name
        self.remote = remote
        self.timeout_s = timeout_s

    @classmethod
    def create(cls, remote_cls: Any, name: str, options: dict[str, Any],
               *args: Any) -> Self:
        """Start an actor from a class made remote by ``wiring``; waits until it is
        constructed (its ``ping`` answers)."""
        actor = remote_cls.options(**options).remote(*args)
        handle = cls(actor, name, remote=True)
        handle.options(timeout_s=CREATE_TIMEOUT_S).ping()
        return handle

    @classmethod
    def local(cls, obj: Any, name: str) -> Self:
        """A handle on a plain object in this process (no Ray): same calls, same errors."""
        return cls(obj, name, remote=False)

    def options(self, *, timeout_s: float | None) -> Self:
        """This handle with another answer timeout (None: wait as long as it takes)."""
        other = copy.copy(self)
        other.timeout_s = timeout_s
        return other

    # -- the machinery the typed methods delegate to -------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        if not self.remote:
            return getattr(self.target, method)(*args)
        return self._get(getattr(self.target, method).remote(*args), self.timeout_s)

    def _start(self, method: str, *args: Any) -> Callable[[], Any]:
        """Send a call now and return a function that waits for its result (or raises what
        ``_call`` would): the caller overlaps the call with other work."""
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
                                 self.timeout_s)

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

    # -- what every actor answers -----------------------------------------------------------
    def ping(self) -> str:
        return self._call("ping")

    def alive(self, timeout_s: float = 10.0) -> bool:
        try:
            self.options(timeout_s=timeout_s).ping()
            return True
        except ActorGone:
            return False

    def kill(self) -> None:
        """Fault injection and shutdown: end the actor process now."""
        if self.remote:
            import ray

            ray.kill(self.target, no_restart=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, remote={self.remote})"
