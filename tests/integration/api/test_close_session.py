"""``close_session`` through a real front and wire client: a closed session's pages go as
its task's end would retire them (audited ones with their summary in the audit log), the
service keeps nothing per closed session however many distinct names come and go, a
close is idempotent and its tenant's own, and a closed session may be opened afresh."""

from __future__ import annotations

import json

import pytest

from agentkv_cluster.api.protocol import RemoteError
from tests.integration.api.test_front_errors import service  # noqa: F401 - the fixture
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration


def _ev(version: int, **fields: object) -> dict:
    return {"event_id": version, "task_id": "t", "version": version, "ts": float(version),
            **fields}


def _used(svc, tenant: str, name: str) -> list[bytes]:
    """A session through one task and a tool call: stored, loaded, released, ended."""
    with svc.client(tenant) as client, client.open_session(name) as s:
        keys = s.store_pages([kv_page(0, "task_input", identity(tenant, name, 0))])
        s.task_start(**_ev(1, prefix_generation=1, input_pages=[0]))
        s.tool_start(**_ev(2, call_id="c", tool="grep"))
        s.observation_return(**_ev(3, call_id="c"))
        assert len(s.load(keys)) == 1
        s.release(keys)
        s.task_end(**_ev(4))
    return keys


def _per_session_state(svc) -> dict[str, int]:
    actor = svc.topo.controller.target  # local mode: the actor itself
    ctl = actor.controller.manager
    return {"sessions": len(ctl.table.sessions), "page_ids": len(ctl.table.by_pid),
            "versions": sum(ctl.events.graph.last_version(t, s) is not None
                            for t in ("acme", "globex") for s in map(str, range(200))),  # the names used
            "tasks": ctl.events.graph.stats().tasks,
            "last_tool": len(ctl.strategy._last_tool),
            "credit_buckets": actor.executor.credits.session_buckets(),
            "prepared_loads": len(svc.front.loads)}


def test_closed_sessions_leave_no_state_however_many_names_come_and_go(service) -> None:  # noqa: F811
    before = _per_session_state(service)
    for i in range(200):
        _used(service, "acme", str(i))
    after = _per_session_state(service)
    assert after == before


def test_closing_is_idempotent_and_a_closed_session_answers_not_found(service) -> None:  # noqa: F811
    with service.client("acme") as client:
        s = client.open_session("twice")
        keys = s.store_pages([kv_page(0, "evidence", identity("acme", "twice", 0))])
        prepared = s.prepare_load(keys)
        closed = s.close()
        assert closed == {"session": "twice", "closed": True, "tasks": 0, "retired": 1,
                          "kept": 0, "pins": 1, "cancelled": closed["cancelled"]}
        assert s.close() == {"session": "twice", "closed": False, "tasks": 0, "retired": 0,
                             "kept": 0, "pins": 0, "cancelled": 0}
        assert client.call("close_session", {"session": "never"})["closed"] is False
        for call in (lambda: s.complete_load(prepared["load_id"]),
                     lambda: s.prepare_load(keys),
                     lambda: s.task_start(**_ev(1, prefix_generation=1))):
            with pytest.raises(RemoteError) as err:
                call()
            assert err.value.code == "not_found"


def test_a_closed_session_opened_again_starts_afresh(service) -> None:  # noqa: F811
    first = _used(service, "acme", "again")
    again = _used(service, "acme", "again")  # the same versions and task id from 1 again
    assert again == first  # the same page, stored anew


def test_a_tenant_never_closes_another_tenants_session_of_the_same_name(service) -> None:  # noqa: F811
    with service.client("globex") as theirs_client:
        theirs = theirs_client.open_session("main")
        keys = theirs.store_pages([kv_page(0, "evidence", identity("globex", "main", 0))])
        with service.client("acme") as client:
            client.open_session("main")
            assert client.open_session("main").close()["retired"] == 0
        assert len(theirs.load(keys)) == 1  # still there, still theirs
        assert theirs.close()["retired"] == 1


def test_a_verified_result_leaves_its_summary_when_its_session_closes(service) -> None:  # noqa: F811
    with service.client("acme") as client, client.open_session("audited-close") as s:
        s.store_pages([kv_page(0, "task_input", identity("acme", "audited-close", 0)),
                       kv_page(1, "temp_reasoning", identity("acme", "audited-close", 128))])
        s.event("task_start", **_ev(1, prefix_generation=1, input_pages=[0]))
        s.event("model_call", **_ev(2, call_id="m1", consumes=[0],
                                    produces=[[1, "temp_reasoning"]]))
        s.event("verification_pass", **_ev(3, call_id="v1", pages=[1]))
    assert service.drain_audit() >= 1
    records = [json.loads(line) for line in
               (service.workdir / "audit.log").read_text().splitlines()]
    assert [r["data"]["type"] for r in records if r["kind"] == "page_retired"
            and r["data"]["session"] == "audited-close"] == ["verified_result"]
