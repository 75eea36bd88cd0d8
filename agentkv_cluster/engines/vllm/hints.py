"""Agent lifecycle hints carried in a vLLM request's ``kv_transfer_params`` (pure).

An agent framework sends them with each model call (an OpenAI client's ``extra_body``)::

    {"kv_transfer_params": {"agentkv": {
        "session": "agent-42",          # the agent session (one task episode)
        "token": "akv1....",             # AgentKV service token: the tenant comes from it
        "events": [{"kind": "tool_start", "tool": "search"}],
        "publish": false}}}              # admins only: write the prefix to the PUBLIC namespace

Everything else in ``kv_transfer_params`` belongs to other connectors and is ignored.
A hint that does not parse raises ``HintError`` (``HintFieldError``, naming the field, for
a name field out of its rule); the connector then serves the request without AgentKV and
reports the error in the response's ``kv_transfer_params``. Names (``session``, ``branch``,
``tool``, ``call_id``) take one rule: letters, digits and ``_ . : @ / -``, so no control
character, newline or blank reaches a log line, an event or the service.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any

KEY = "agentkv"
_NAME_CHARS = "A-Za-z0-9_.:@/-"  # session, branch, tool and call id names
_NAME_RE = re.compile(f"[{_NAME_CHARS}]+")
_MAX_SESSION = 256
_MAX_NAME = 128  # branch, tool, call_id
_FIELDS = frozenset({"session", "token", "events", "event", "publish", "branch"})
_MAX_EVENTS = 16
_MAX_TOKEN = 4096


class HintError(ValueError):
    """Malformed or unknown lifecycle hints."""


class HintFieldError(HintError):
    """A name field (``session``, ``branch``, ``tool``, ``call_id``) out of its rule."""

    def __init__(self, field: str, limit: int) -> None:
        super().__init__(f"{field} must match [{_NAME_CHARS}]{{1,{limit}}}")
        self.field = field


class HintKind(enum.Enum):
    """Lifecycle events an agent framework reports (a subset of the service's events)."""

    TASK_START = "task_start"
    MODEL_CALL = "model_call"
    TOOL_START = "tool_start"  # with the tool class: the gap predictor keys on it
    OBSERVATION_RETURN = "observation_return"
    TASK_END = "task_end"
    BRANCH_ABANDONED = "branch_abandoned"


_EVENT_FIELDS = {
    HintKind.TASK_START: frozenset(),
    HintKind.MODEL_CALL: frozenset({"call_id"}),
    HintKind.TOOL_START: frozenset({"tool", "call_id", "expected_s"}),
    HintKind.OBSERVATION_RETURN: frozenset({"call_id"}),
    HintKind.TASK_END: frozenset({"ok"}),
    HintKind.BRANCH_ABANDONED: frozenset({"branch"}),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class HintEvent:
    kind: HintKind
    tool: str = ""  # TOOL_START: the tool class
    call_id: str = ""
    expected_s: float | None = None  # TOOL_START: the framework's own estimate, if any
    branch: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentHints:
    session: str | None = None
    token: str | None = None
    events: tuple[HintEvent, ...] = ()
    publish: bool = False
    branch: str = ""  # the session's branch this request works on ("": its trunk)

    @property
    def present(self) -> bool:
        return self.session is not None or self.token is not None or bool(self.events)


NO_HINTS = AgentHints()


def _name(field: str, value: Any, limit: int = _MAX_NAME) -> str:
    """A name hint: a string of 1..``limit`` characters of the name rule, else
    ``HintFieldError`` naming ``field`` (the value itself is never echoed)."""
    if not isinstance(value, str) or len(value) > limit or not _NAME_RE.fullmatch(value):
        raise HintFieldError(field, limit)
    return value


def _seconds(value: Any) -> float | None:
    """``expected_s``: a finite number >= 0 (an integer too large for a float is not)."""
    if value is None:
        return None
    try:
        seconds = float(value) if type(value) in (int, float) else math.nan
    except OverflowError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise HintError("expected_s must be a finite number >= 0")
    return seconds


def parse_event(raw: Any) -> HintEvent:
    if not isinstance(raw, dict):
        raise HintError("an event must be an object with a 'kind'")
    try:
        kind = HintKind(raw.get("kind"))
    except ValueError:
        known = ", ".join(k.value for k in HintKind)
        raise HintError(f"unknown event kind {raw.get('kind')!r:.40}; expected one of {known}"
                        ) from None
    extra = set(raw) - {"kind"} - _EVENT_FIELDS[kind]
    if extra:
        raise HintError(f"{kind.value} does not take {sorted(map(str, extra))!r:.80}")
    expected = _seconds(raw.get("expected_s"))
    if kind is HintKind.TOOL_START and "tool" not in raw:
        raise HintError("tool_start needs the tool class ('tool')")
    if "ok" in raw and type(raw["ok"]) is not bool:
        raise HintError("ok must be a bool")
    return HintEvent(
        kind=kind,
        tool=_name("tool", raw["tool"]) if "tool" in raw else "",
        call_id=_name("call_id", raw["call_id"]) if "call_id" in raw else "",
        expected_s=expected,
        branch=_name("branch", raw["branch"]) if "branch" in raw else "",
    )


def parse_hints(params: Any) -> AgentHints:
    """The hints in a request's ``kv_transfer_params`` (``NO_HINTS`` when there are none)."""
    if params is None:
        return NO_HINTS
    if not isinstance(params, dict):
        raise HintError("kv_transfer_params must be an object")
    raw = params.get(KEY)
    if raw is None:
        return NO_HINTS
    if not isinstance(raw, dict):
        raise HintError(f"kv_transfer_params.{KEY} must be an object")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise HintError(f"unknown hint fields {sorted(map(str, unknown))!r:.80}; "
                        f"expected some of {sorted(_FIELDS)}")
    session = raw.get("session")
    if session is not None:
        session = _name("session", session, _MAX_SESSION)
    token = raw.get("token")
    if token is not None and (not isinstance(token, str) or not 0 < len(token) <= _MAX_TOKEN):
        raise HintError(f"token must be a string of 1..{_MAX_TOKEN} characters")
    events_raw = raw.get("events", [])
    if not isinstance(events_raw, list):  # checked before 'event' joins it: never dropped
        raise HintError(f"events must be a list of at most {_MAX_EVENTS} objects")
    if "event" in raw:
        events_raw = [raw["event"], *events_raw]
    if len(events_raw) > _MAX_EVENTS:
        raise HintError(f"events must be a list of at most {_MAX_EVENTS} objects")
    publish = raw.get("publish", False)
    if type(publish) is not bool:
        raise HintError("publish must be a bool")
    events = tuple(parse_event(e) for e in events_raw)
    if events and session is None:
        raise HintError("events need the session they belong to")
    branch = _name("branch", raw["branch"]) if "branch" in raw else ""
    if branch and session is None:
        raise HintError("a branch needs the session it belongs to")
    return AgentHints(session=session, token=token, events=events, publish=publish,
                      branch=branch)
