"""Requests the API front refuses with a clear error (never ``internal``), and the audit
record every cross-tenant denial leaves (the service's own audit log, verified)."""

from __future__ import annotations

import json
import time

import pytest

from agentkv_cluster.api.protocol import RemoteError
from security.audit import verify_log
from security.signing import load_verifier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-front-", page_bytes=1 << 17, hbm_pages=8,
                       pool_bytes=4 << 20) as svc:
        yield svc


def test_lookup_on_a_session_never_opened_is_not_found(service) -> None:
    with service.client("acme") as client:
        client.open_session("opened")  # provisions the tenant
        with pytest.raises(RemoteError) as err:
            client.call("lookup_prefix", {"session": "never",
                                          "identities": [identity("acme", "never", 0).pack()]})
        assert err.value.code == "not_found" and "acme" not in err.value.message


@pytest.mark.parametrize("op", ["lookup_prefix", "store_pages"])
def test_a_tenant_that_never_opened_a_session_gets_not_found(service, op) -> None:
    """No keys exist for the tenant yet: a clear not_found, not ``internal: KeyUnavailable``."""
    with service.client("newcomer") as client:
        ident = identity("newcomer", "s", 0)
        args = ({"session": "s", "identities": [ident.pack()]} if op == "lookup_prefix" else
                {"session": "s", "pages": [kv_page(0, "evidence", ident)]})
        with pytest.raises(RemoteError) as err:
            client.call(op, args)
        assert err.value.code == "not_found", err.value
        assert "newcomer" not in err.value.message


def test_what_is_not_there_is_not_found_and_what_is_malformed_is_bad_args(service) -> None:
    """The controller's refusals reach the API as their class says (``RefusedNotFound`` or
    ``RequestRefused``), not by the wording of their messages."""
    with service.client("acme") as client:
        s = client.open_session("refusals")
        (key,) = s.store_pages([kv_page(0, "evidence", identity("acme", "refusals", 0))])
        cases = [
            ("not_found", lambda: s.release([key + b"-never-stored"])),
            ("not_found", lambda: s.prepare_load([key + b"-never-stored"])),
            ("not_found", lambda: s.event("task_start", event_id=1, task_id="t", version=1,
                                          ts=1.0, prefix_generation=1, prefix_pages=[7])),
            ("bad_args", lambda: s.event("model_call", event_id=2, task_id="nope", version=2,
                                         ts=2.0, call_id="m")),
        ]
        for code, call in cases:
            with pytest.raises(RemoteError) as err:
                call()
            assert err.value.code == code, err.value
        s.event("task_start", event_id=3, task_id="t", version=3, ts=3.0, prefix_generation=1,
                prefix_pages=[0])  # nothing was changed by the refusals


def test_a_load_or_release_that_names_a_page_twice_is_bad_args(service) -> None:
    """A page named twice in one load (or release) is a client bug: refused whole, and the
    page stays as it was (loadable once, released once)."""
    with service.client("acme") as client:
        s = client.open_session("twice")
        (key,) = s.store_pages([kv_page(0, "evidence", identity("acme", "twice", 0))])
        for call in (lambda: s.prepare_load([key, key]), lambda: s.release([key, key])):
            with pytest.raises(RemoteError) as err:
                call()
            assert err.value.code == "bad_args" and "more than once" in err.value.message
        (data,) = s.load([key])
        assert data == kv_page(0, "evidence", identity("acme", "twice", 0))["data"]
        assert s.release([key]) == 1


def test_a_load_larger_than_the_hbm_is_refused_at_once(service) -> None:
    """Regression (found from outside): a load of more pages than the HBM actor holds could
    never be pinned, yet it waited for room until its 45 s deadline, holding a server
    thread, before the same ``bad_args``. Loads that fit still work."""
    with service.client("acme") as client:
        s = client.open_session("outsized")
        keys = s.store_pages([kv_page(i, "evidence", identity("acme", "outsized", 1000 * i))
                              for i in range(9)])  # the HBM holds 8
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as err:
            s.prepare_load(keys)
        assert err.value.code == "bad_args" and "fewer pages" in err.value.message
        assert time.monotonic() - t0 < 5.0
        assert len(s.load(keys[:3])) == 3
        s.release(keys[:3])


def test_an_event_nested_a_thousand_deep_is_bad_args(service) -> None:
    deep: object = 1
    for _ in range(1000):
        deep = [deep]
    with service.client("acme") as client:
        s = client.open_session("deep")
        with pytest.raises(RemoteError) as err:
            s.event("task_start", event_id=1, task_id="t", version=1, ts=1.0,
                    prefix_generation=1, extra=deep)
        assert err.value.code == "bad_args"
        s.event("task_start", event_id=1, task_id="t", version=1, ts=1.0, prefix_generation=1)


def test_every_cross_tenant_denial_is_audited(service) -> None:
    log = service.workdir / "audit.log"
    with service.client("acme") as client:
        s = client.open_session("spy")
        with pytest.raises(RemoteError, match="forbidden"):  # a page naming globex
            s.store_pages([kv_page(0, "evidence", identity("globex", "spy", 0))])
        got = s.lookup_prefix([identity("globex", "x", 0).pack()])
        assert got["length"] == 0 and got["refused"].startswith("AccessDenied")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    denied = [r["data"] for r in records if r["kind"] == "access.denied"]
    assert [(d["tenant"], d["namespace"], d["action"]) for d in denied[-2:]] == [
        ("acme", "globex", "write"), ("acme", "globex", "read")]
    report = verify_log(log, load_verifier(service.workdir / "audit.pub"))
    assert report.ok, report.problems
