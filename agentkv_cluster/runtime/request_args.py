"""What a request carries, checked before the API front acts on it (no I/O, no state):
a session's name, an event's fields and nesting, a stored page's identity and fields (its
KV shape against its bytes), an identity's token count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentkv_cluster.api.errors import InvalidArgument
from agentkv_cluster.lifecycle.identity import IdentityError, PageIdentity
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.records import KvShape
from store.types import KV_DTYPE_NAMES

MAX_EVENT_DEPTH = 32  # nesting of maps and lists inside one event


def event_depth(value: Any, limit: int = MAX_EVENT_DEPTH + 1) -> int:
    """Nesting depth of maps and lists in ``value`` (iterative; stops past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list) and level <= limit:
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return deepest


def session_name(session: str) -> str:
    """``session``, if it is a name the service keeps (1..256 characters)."""
    if not 0 < len(session) <= 256:
        raise InvalidArgument("session must be 1..256 characters")
    return session


def event_fields(event: dict[str, Any]) -> dict[str, Any]:
    """``event``, if it names neither tenant nor session (those come from the token and
    the request) and nests at most ``MAX_EVENT_DEPTH`` levels."""
    if "tenant" in event or "session" in event:
        raise InvalidArgument("tenant and session come from the token and the request")
    if event_depth(event) > MAX_EVENT_DEPTH:
        raise InvalidArgument(f"event nests deeper than {MAX_EVENT_DEPTH} levels")
    return event


def kv_shape(page: dict[str, Any], length: int) -> KvShape | None:
    """The page's ``shape`` and ``dtype`` (None: opaque bytes), checked against its length."""
    dims = page.get("shape")
    if dims is None:
        return None
    dtype = page.get("dtype", "float16")
    if not isinstance(dims, list) or len(dims) != 4 or \
            not all(type(d) is int and d > 0 for d in dims) or dtype not in KV_DTYPE_NAMES:
        raise InvalidArgument("shape must be [layers, kv_heads, tokens, head_dim] and dtype "
                              f"one of {KV_DTYPE_NAMES}")
    shape = KvShape.from_dims(dims, dtype)
    if shape.nbytes() != length:
        raise InvalidArgument(f"shape gives {shape.nbytes()} bytes, data has {length}")
    return shape


def page_identity(page: dict[str, Any]) -> PageIdentity:
    try:
        return PageIdentity.unpack(page["identity"])
    except (KeyError, TypeError, IdentityError) as exc:
        raise InvalidArgument(f"bad page identity: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class PageFields:
    """What a request says of one page besides its identity, checked."""

    shape: KvShape | None  # ``kv_shape``: None for opaque bytes
    state_type: StateType
    page_id: int  # the engine's id within the session (default: the identity's start)
    structured: bool  # the page feeds code or JSON output


def page_fields(page: dict[str, Any], length: int, identity: PageIdentity) -> PageFields:
    """A stored page's fields; ``InvalidArgument`` naming the first bad one."""
    shape = kv_shape(page, length)
    try:
        state_type = StateType(page.get("state_type", "temp_reasoning"))
    except ValueError:
        raise InvalidArgument(f"unknown state_type {page.get('state_type')!r:.40}") from None
    pid = page.get("page_id", identity.start)
    if type(pid) is not int or pid < 0:
        raise InvalidArgument("page_id must be a non-negative int")
    structured = page.get("structured", False)
    if type(structured) is not bool:
        raise InvalidArgument("structured must be true or false")
    return PageFields(shape=shape, state_type=state_type, page_id=pid, structured=structured)


def identity_tokens(raw: Any) -> int:
    """Tokens a (possibly malformed) packed identity covers, for lookup metrics; 0 if bad."""
    try:
        identity = PageIdentity.unpack(raw)
    except (TypeError, IdentityError):
        return 0
    return identity.end - identity.start
