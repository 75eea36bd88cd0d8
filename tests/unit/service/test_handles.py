"""Typed actor handles: each method is one of its actor's methods, with the same parameters;
no actor method is left without one; an unknown method fails where it is called; local
calls raise the actor's own exception (at once, or from a started call's waiter)."""

from __future__ import annotations

import inspect

import pytest

from agentkv_cluster.runtime.actor_watch import Liveness, liveness
from agentkv_cluster.runtime.controller_actor import ControllerActor
from agentkv_cluster.runtime.directory_glue import DirectoryShell
from agentkv_cluster.runtime.handles import (
    DEFAULT_TIMEOUT_S,
    ActorHandle,
    ControllerHandle,
    DirectoryHandle,
    HbmHandle,
    PoolHandle,
)
from agentkv_cluster.runtime.hbm_actor import HbmActor
from agentkv_cluster.runtime.wiring import PoolShell

PAIRS = [(PoolHandle, PoolShell), (HbmHandle, HbmActor), (ControllerHandle, ControllerActor),
         (DirectoryHandle, DirectoryShell)]
# handle methods that send an actor method and return a waiter
STARTED = {"start_land": "land", "start_serve": "serve"}


def _public(cls: type, stop: type = object) -> dict[str, object]:
    return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_") and not hasattr(stop, n)}


def _params(fn: object) -> list[tuple[str, object, object]]:
    """The parameters after ``self``, less the ``_ray_trace_ctx`` that Ray adds to an actor
    class's methods once an actor of it was created in this interpreter."""
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in list(sig.parameters.values())[1:]
            if p.name != "_ray_trace_ctx"]


@pytest.mark.parametrize(("handle", "actor"), PAIRS, ids=lambda c: c.__name__)
def test_every_handle_method_is_its_actors_method_with_the_same_parameters(handle, actor):
    methods = _public(handle, ActorHandle)
    assert methods, handle
    for name, fn in methods.items():
        target = getattr(actor, STARTED.get(name, name), None)
        assert target is not None, f"{handle.__name__}.{name}: {actor.__name__} has no such method"
        assert _params(fn) == _params(target), f"{handle.__name__}.{name}"


@pytest.mark.parametrize(("handle", "actor"), PAIRS, ids=lambda c: c.__name__)
def test_every_actor_method_has_a_typed_handle_method(handle, actor):
    missing = set(_public(actor)) - set(dir(handle))
    assert not missing, f"{actor.__name__} methods without a {handle.__name__} method: {missing}"


class _Hbm:
    def ping(self) -> str:
        return "hbm"

    def drop(self, key: bytes, scrub: bool = False) -> bool:
        return key == b"k"

    def land(self, key: bytes, page: int, length: int, owner: str) -> None:
        if owner != "me":
            raise KeyError(f"page {page} is not reserved by {owner}")


def test_an_unknown_method_is_an_attribute_error_at_the_call_site():
    handle = HbmHandle.local(_Hbm(), "h")
    with pytest.raises(AttributeError):
        handle.drop_page(b"k")  # type: ignore[attr-defined] - a typo: no catch-all turns it
    assert handle.drop(b"k") is True  # into a remote call


def test_local_calls_raise_the_actors_exception_and_started_calls_raise_from_the_waiter():
    handle = HbmHandle.local(_Hbm(), "h")
    assert liveness(handle) is Liveness.ALIVE and handle.ping() == "hbm"
    with pytest.raises(KeyError, match="not reserved by you"):
        handle.land(b"k", 3, 10, "you")
    waiter = handle.start_land(b"k", 3, 10, "you")  # the error waits for the waiter
    with pytest.raises(KeyError, match="not reserved by you"):
        waiter()
    assert handle.start_land(b"k", 3, 10, "me")() is None


def test_options_gives_a_copy_with_its_own_timeout():
    handle = PoolHandle.local(object(), "p")
    quick = handle.options(timeout_s=5.0)
    assert type(quick) is PoolHandle and quick.target is handle.target and quick.name == "p"
    assert (quick.timeout_s, handle.timeout_s) == (5.0, DEFAULT_TIMEOUT_S)
