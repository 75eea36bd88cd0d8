"""Events: typed frozen records, msgpack round trip, validation errors."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from agentkv_cluster.lifecycle import events as ev
from agentkv_cluster.lifecycle.graph import EventGraph
from agentkv_cluster.lifecycle.types import StateType as T
from tests.unit.lifecycle.builders import Session, ref, snapshot

COMMON = {"event_id": 11, "tenant": "acme", "session": "s1", "task_id": "task-1", "version": 5,
          "ts": 12.5}
SAMPLES: dict[ev.EventKind, ev.Event] = {
    ev.EventKind.TASK_START: ev.TaskStart(**COMMON, prefix_generation=2, prefix_pages=(1, 2),
                                          input_pages=(3,)),
    ev.EventKind.MODEL_CALL: ev.ModelCall(**COMMON, call_id="m1", branch="b1", consumes=(1, 3),
                                          produces=(ref(4, T.TEMP_REASONING),)),
    ev.EventKind.TOOL_START: ev.ToolStart(**COMMON, call_id="t1", tool="web.search",
                                          consumes=(4,)),
    ev.EventKind.OBSERVATION_RETURN: ev.ObservationReturn(
        **COMMON, call_id="t1", produces=(ref(5, T.TOOL_OBSERVATION), ref(6, T.EVIDENCE)),
        supersedes=(2,), ok=False),
    ev.EventKind.BRANCH_CREATE: ev.BranchCreate(**COMMON, branch="b1", parent="main"),
    ev.EventKind.VERIFICATION_PASS: ev.VerificationPass(**COMMON, call_id="v1", pages=(4,)),
    ev.EventKind.ROLLBACK: ev.Rollback(**COMMON, branch="b1"),
    ev.EventKind.TASK_END: ev.TaskEnd(**COMMON, ok=False),
}


def test_samples_cover_all_eight_kinds() -> None:
    assert set(SAMPLES) == set(ev.EventKind)
    assert len(ev.EventKind) == 8
    assert all(e.kind is k for k, e in SAMPLES.items())


@pytest.mark.parametrize("kind", list(ev.EventKind))
def test_msgpack_roundtrip(kind: ev.EventKind) -> None:
    event = SAMPLES[kind]
    raw = ev.encode_event(event)
    back = ev.decode_event(raw)
    assert back == event
    assert type(back) is type(event)
    assert msgpack.unpackb(raw)["kind"] == kind.value
    assert ev.encode_event(back) == raw


@pytest.mark.parametrize("kind", list(ev.EventKind))
def test_events_are_frozen_with_common_fields(kind: ev.EventKind) -> None:
    event = SAMPLES[kind]
    assert (event.event_id, event.tenant, event.session, event.task_id, event.version,
            event.ts) == (11, "acme", "s1", "task-1", 5, 12.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.version = 6  # type: ignore[misc]


def _wire(kind: ev.EventKind) -> dict:
    return ev.event_to_dict(SAMPLES[kind])


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


@pytest.mark.parametrize(("data", "error", "message"), [
    ({**_wire(ev.EventKind.TOOL_START), "kind": "tool_stop"}, ev.UnknownEventKind, "tool_stop"),
    ({**_wire(ev.EventKind.TOOL_START), "kind": 3}, ev.UnknownEventKind, "3"),
    (_without(_wire(ev.EventKind.TOOL_START), "kind"), ev.MissingField, "kind"),
    (_without(_wire(ev.EventKind.TOOL_START), "tool"), ev.MissingField, "ToolStart.tool"),
    (_without(_wire(ev.EventKind.TASK_END), "tenant"), ev.MissingField, "TaskEnd.tenant"),
    (_without(_wire(ev.EventKind.ROLLBACK), "branch"), ev.MissingField, "Rollback.branch"),
    (_without(_wire(ev.EventKind.MODEL_CALL), "version"), ev.MissingField, "ModelCall.version"),
    ({**_wire(ev.EventKind.TASK_END), "extra": 1}, ev.UnexpectedField, "extra"),
    ({**_wire(ev.EventKind.TASK_END), "version": -1}, ev.InvalidField, "version"),
    ({**_wire(ev.EventKind.TASK_END), "version": "5"}, ev.InvalidField, "version"),
    ({**_wire(ev.EventKind.TASK_END), "ts": float("nan")}, ev.InvalidField, "ts"),
    ({**_wire(ev.EventKind.TASK_END), "ok": 1}, ev.InvalidField, "ok"),
    ({**_wire(ev.EventKind.TASK_END), "session": ""}, ev.InvalidField, "session"),
    ({**_wire(ev.EventKind.MODEL_CALL), "consumes": [1, 1]}, ev.InvalidField, "repeats"),
    ({**_wire(ev.EventKind.MODEL_CALL), "consumes": 1}, ev.InvalidField, "consumes"),
    ({**_wire(ev.EventKind.MODEL_CALL), "produces": [[4, "draft"]]}, ev.InvalidField, "draft"),
    ({**_wire(ev.EventKind.MODEL_CALL), "produces": [[4]]}, ev.InvalidField, "produces"),
    ([1, 2], ev.MalformedEvent, "map"),
])
def test_validation_errors(data: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ev.event_from_dict(data)


def test_all_validation_errors_share_one_base() -> None:
    for cls in (ev.MalformedEvent, ev.UnknownEventKind, ev.MissingField, ev.UnexpectedField,
                ev.InvalidField, ev.OutOfOrderVersion, ev.UnknownReference,
                ev.ConflictingEvent):
        assert issubclass(cls, ev.EventValidationError)


@pytest.mark.parametrize("raw", [b"\xc1", b"\x92\x01", b"\x81\xa4kind", b""])
def test_decode_rejects_bad_bytes(raw: bytes) -> None:
    with pytest.raises(ev.EventValidationError):
        ev.decode_event(raw)


def test_base_event_is_not_a_kind() -> None:
    bare = ev.Event(**COMMON)
    with pytest.raises(ev.UnknownEventKind):
        ev.encode_event(bare)
    with pytest.raises(ev.UnknownEventKind):
        ev.validate_event(bare)


def test_int_timestamp_is_accepted_as_float() -> None:
    e = ev.event_from_dict({**_wire(ev.EventKind.TASK_END), "ts": 3})
    assert e.ts == 3.0 and type(e.ts) is float


def test_validate_event_checks_directly_built_events() -> None:
    bad = ev.ToolStart(**{**COMMON, "version": -3}, call_id="t", tool="x")
    with pytest.raises(ev.InvalidField, match="version"):
        ev.validate_event(bad)
    assert ev.validate_event(SAMPLES[ev.EventKind.ROLLBACK]) == SAMPLES[ev.EventKind.ROLLBACK]


@pytest.mark.parametrize("version", [3, 4])  # equal to, and below, the last version
def test_out_of_order_version_rejected_and_graph_unchanged(version: int) -> None:
    g, s = EventGraph(), Session()
    g.apply(s.make(ev.TaskStart, prefix_generation=0, input_pages=(1,)), now=0.0)  # v1
    g.apply(s.make(ev.ModelCall, call_id="m1", consumes=(1,)), now=1.0)  # v2
    g.apply(s.make(ev.ToolStart, call_id="t1", tool="grep"), now=2.0)  # v3
    g.apply(s.make(ev.ObservationReturn, call_id="t1",
                   produces=(ref(2, T.TOOL_OBSERVATION),), version=4), now=3.0)
    before = snapshot(g)
    late = s.make(ev.ModelCall, call_id="m2", consumes=(1, 2), version=version)
    with pytest.raises(ev.OutOfOrderVersion, match=f"version {version} after 4"):
        g.apply(late, now=4.0)
    assert snapshot(g) == before
    assert g.last_version("acme", "s1") == 4


def test_versions_are_per_session() -> None:
    g = EventGraph()
    a, b = Session(session="sa"), Session(session="sb")
    g.apply(a.make(ev.TaskStart, prefix_generation=0, version=10), now=0.0)
    g.apply(b.make(ev.TaskStart, prefix_generation=0, version=1), now=0.0)
    assert (g.last_version("acme", "sa"), g.last_version("acme", "sb")) == (10, 1)
