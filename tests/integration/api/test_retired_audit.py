"""Retired audited pages leave their irreversible summary (identity, type, content hash) in
the service's signed audit log (paper §5.2), through a real front and wire client."""

from __future__ import annotations

import hashlib
import json

import pytest

from security.audit import verify_log
from security.signing import load_verifier
from tests.integration.api.test_front_errors import service  # noqa: F401 - the fixture
from tests.integration.runtime.test_cluster import identity, kv_page

pytestmark = pytest.mark.integration


def _ev(version: int, **fields: object) -> dict:
    return {"event_id": version, "task_id": "t", "version": version, "ts": float(version),
            **fields}


def test_a_verified_result_leaves_its_content_hash_in_the_audit_log(service) -> None:  # noqa: F811
    with service.client("acme") as client:
        s = client.open_session("audited")
        pages = [kv_page(0, "task_input", identity("acme", "audited", 0)),
                 kv_page(1, "temp_reasoning", identity("acme", "audited", 128))]
        s.store_pages(pages)
        s.event("task_start", **_ev(1, prefix_generation=1, input_pages=[0]))
        s.event("model_call", **_ev(2, call_id="m1", consumes=[0],
                                    produces=[[1, "temp_reasoning"]]))
        s.event("verification_pass", **_ev(3, call_id="v1", pages=[1]))
        s.event("task_end", **_ev(4))
    assert service.drain_audit() >= 1
    log = service.workdir / "audit.log"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    retired = [r["data"] for r in records if r["kind"] == "page_retired"]
    want = hashlib.blake2b(pages[1]["data"], digest_size=16, person=b"akv-page").hexdigest()
    assert [(d["type"], d["content_hash"]) for d in retired if d["session"] == "audited"] == [
        ("verified_result", want)]  # the task input is not an audited type: no summary
    report = verify_log(log, load_verifier(service.workdir / "audit.pub"))
    assert report.ok, report.problems
