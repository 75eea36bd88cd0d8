"""The demo's workload dials its sessions a few at a time (``DIAL_AT_ONCE``).

``agentkv demo --sessions 2000`` opened every session's connection at once from one
address; the server's pre-auth limit (``per_source``, oldest closed) and the client's
bounded hello retries then failed 1,676 sessions with 'server closed the connection'."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Self

import pytest

from agentkv_cluster.api import workload
from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.api.server import PreAuthLimits
from agentkv_cluster.api.workload import DIAL_AT_ONCE, WorkloadSpec, run_workload
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


def test_sessions_dial_a_few_at_a_time_and_all_run() -> None:
    lock = threading.Lock()
    dialing = [0, 0]  # now, most at once

    class Counted(AgentKvClient):
        def hello(self) -> dict:
            try:
                return super().hello()
            finally:
                with lock:
                    dialing[0] -= 1

    spec = WorkloadSpec(sessions=48, turns=1, seed=228, stagger_s=0.0,
                        tool_plan=((("quick", 0.01),),))
    with local_service("agentkv-dials-", page_bytes=1 << 20, hbm_pages=512,
                       pool_bytes=64 << 20) as svc:
        svc.server.preauth = replace(PreAuthLimits(), per_source=DIAL_AT_ONCE)
        token = svc.token("demo")

        def connect() -> AgentKvClient:
            with lock:
                dialing[0] += 1
                dialing[1] = max(dialing[1], dialing[0])
            return Counted.connect(svc.address, token)

        results = run_workload(connect, spec, "dials")
    assert results.errors == []
    assert results.accesses  # every session resumed and read its pages back
    assert 1 <= dialing[1] <= DIAL_AT_ONCE


def test_a_session_still_running_is_an_error_not_a_figure(monkeypatch) -> None:
    monkeypatch.setattr(workload, "SESSION_TIMEOUT_S", 0.2)
    release = threading.Event()

    class Slow:
        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def hello(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(workload, "run_episode", lambda *a, **k: release.wait(10))
    results = run_workload(Slow, WorkloadSpec(sessions=2, stagger_s=0.0), "slow")
    release.set()
    assert len(results.errors) == 2 and "still running" in results.errors[0]
