"""Workflow events the orchestrator reports (§2.1), with msgpack wire form and validation."""

from __future__ import annotations

import enum
import math
from dataclasses import MISSING, dataclass, fields
from typing import Any

import msgpack

from agentkv_cluster.lifecycle.types import StateType


class EventKind(enum.Enum):
    TASK_START = "task_start"
    MODEL_CALL = "model_call"
    TOOL_START = "tool_start"
    OBSERVATION_RETURN = "observation_return"
    BRANCH_CREATE = "branch_create"
    VERIFICATION_PASS = "verification_pass"
    ROLLBACK = "rollback"
    TASK_END = "task_end"


class EventValidationError(ValueError):
    """An event that is malformed or does not fit the state it is applied to."""


class MalformedEvent(EventValidationError):
    """Bytes that are not a msgpack map."""


class UnknownEventKind(EventValidationError):
    pass


class MissingField(EventValidationError):
    pass


class UnexpectedField(EventValidationError):
    pass


class InvalidField(EventValidationError):
    """A field of the wrong type or out of range."""


class OutOfOrderVersion(EventValidationError):
    """A session's event versions must strictly increase."""


class UnknownReference(EventValidationError):
    """The event names a task, branch, call or page the graph does not know."""


class ConflictingEvent(EventValidationError):
    """The event contradicts the graph (duplicate task, closed branch, stale prefix...)."""


MAIN_BRANCH = "main"


@dataclass(frozen=True, slots=True)
class PageRef:
    """A page an event produces, with the type its protocol boundary gives it."""

    page_id: int
    state_type: StateType


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Fields every event carries. ``version`` is per session, strictly increasing."""

    event_id: int
    tenant: str
    session: str
    task_id: str
    version: int
    ts: float  # orchestrator timestamp, seconds

    @property
    def kind(self) -> EventKind:
        kind = _KIND_OF.get(type(self))
        if kind is None:  # the bare base class, or a subclass made elsewhere
            raise UnknownEventKind(f"not an event kind: {type(self).__name__}")
        return kind


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskStart(Event):
    prefix_generation: int
    prefix_pages: tuple[int, ...] = ()
    input_pages: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCall(Event):
    call_id: str
    branch: str = MAIN_BRANCH
    consumes: tuple[int, ...] = ()
    produces: tuple[PageRef, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolStart(Event):
    call_id: str
    tool: str  # tool class (or a hash of the tool name)
    branch: str = MAIN_BRANCH
    consumes: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservationReturn(Event):
    call_id: str  # the ToolStart this answers
    produces: tuple[PageRef, ...] = ()
    supersedes: tuple[int, ...] = ()
    ok: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class BranchCreate(Event):
    branch: str
    parent: str = MAIN_BRANCH


@dataclass(frozen=True, kw_only=True, slots=True)
class VerificationPass(Event):
    call_id: str
    branch: str = MAIN_BRANCH
    pages: tuple[int, ...] = ()  # temporary reasoning that passed becomes verified


@dataclass(frozen=True, kw_only=True, slots=True)
class Rollback(Event):
    branch: str  # abandoned; its pages become failed branch


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskEnd(Event):
    ok: bool = True


_CLASSES: dict[EventKind, type[Event]] = {
    EventKind.TASK_START: TaskStart,
    EventKind.MODEL_CALL: ModelCall,
    EventKind.TOOL_START: ToolStart,
    EventKind.OBSERVATION_RETURN: ObservationReturn,
    EventKind.BRANCH_CREATE: BranchCreate,
    EventKind.VERIFICATION_PASS: VerificationPass,
    EventKind.ROLLBACK: Rollback,
    EventKind.TASK_END: TaskEnd,
}
_KIND_OF = {cls: kind for kind, cls in _CLASSES.items()}
_U64 = 2**64 - 1


def _int(name: str, v: Any) -> int:
    if type(v) is not int or not 0 <= v <= _U64:
        raise InvalidField(f"{name} must be an int in [0, 2**64), got {v!r}")
    return v


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise InvalidField(f"{name} must be a non-empty str, got {v!r}")
    return v


def _float(name: str, v: Any) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or v < 0:
        raise InvalidField(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if type(v) is not bool:
        raise InvalidField(f"{name} must be a bool, got {v!r}")
    return v


def _ints(name: str, v: Any) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise InvalidField(f"{name} must be a list of page ids, got {v!r}")
    out = tuple(_int(f"{name}[{i}]", x) for i, x in enumerate(v))
    if len(set(out)) != len(out):
        raise InvalidField(f"{name} repeats a page id")
    return out


def _ref(name: str, v: Any) -> PageRef:
    if isinstance(v, PageRef):
        v = (v.page_id, v.state_type.value)
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise InvalidField(f"{name} must be [page_id, state_type], got {v!r}")
    try:
        state_type = StateType(v[1])
    except ValueError:
        raise InvalidField(f"{name} has unknown state type {v[1]!r}") from None
    return PageRef(_int(name, v[0]), state_type)


def _refs(name: str, v: Any) -> tuple[PageRef, ...]:
    if not isinstance(v, (list, tuple)):
        raise InvalidField(f"{name} must be a list of [page_id, state_type], got {v!r}")
    out = tuple(_ref(f"{name}[{i}]", x) for i, x in enumerate(v))
    if len({r.page_id for r in out}) != len(out):
        raise InvalidField(f"{name} repeats a page id")
    return out


_CHECKS = {
    "int": _int, "str": _str, "float": _float, "bool": _bool,
    "tuple[int, ...]": _ints, "tuple[PageRef, ...]": _refs,
}


def event_from_dict(data: Any) -> Event:
    """Build a typed event from its wire dict; every problem is an ``EventValidationError``."""
    if not isinstance(data, dict):
        raise MalformedEvent(f"an event is a map, got {type(data).__name__}")
    if "kind" not in data:
        raise MissingField("kind")
    try:
        cls = _CLASSES[EventKind(data["kind"])]
    except (ValueError, TypeError):
        raise UnknownEventKind(f"unknown event kind {data['kind']!r}") from None
    spec = {f.name: f for f in fields(cls)}
    extra = sorted(set(data) - set(spec) - {"kind"}, key=str)
    if extra:
        raise UnexpectedField(f"{cls.__name__} has no field(s) {extra}")
    values: dict[str, Any] = {}
    for name, f in spec.items():
        if name not in data:
            if f.default is MISSING:
                raise MissingField(f"{cls.__name__}.{name}")
            continue
        values[name] = _CHECKS[f.type](name, data[name])
    return cls(**values)


def check_header(event: Event) -> None:
    """Cheap check of the common fields, for events built in-process (not via the wire)."""
    for name in ("event_id", "version"):
        _int(name, getattr(event, name))
    for name in ("tenant", "session", "task_id"):
        _str(name, getattr(event, name))
    _float("ts", event.ts)


def validate_event(event: Event) -> Event:
    """Re-check a directly constructed event the way the wire path does."""
    if type(event) not in _KIND_OF:
        raise UnknownEventKind(f"not an event: {type(event).__name__}")
    return event_from_dict(event_to_dict(event))


def event_to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": event.kind.value}
    for f in fields(event):
        value = getattr(event, f.name)
        if f.type == "tuple[PageRef, ...]":
            value = [[r.page_id, r.state_type.value] for r in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def encode_event(event: Event) -> bytes:
    return msgpack.packb(event_to_dict(event), use_bin_type=True)


def decode_event(data: bytes) -> Event:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise MalformedEvent(f"not a msgpack event: {exc}") from exc
    return event_from_dict(raw)
