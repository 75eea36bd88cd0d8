"""``IdleSessions``: which open sessions have gone unused for the service's idle limit."""

from __future__ import annotations

import pytest

from agentkv_cluster.config import ConfigError, load_config
from agentkv_cluster.runtime.idle_sessions import IdleSessions
from agentkv_cluster.runtime.records import TenantErased


def test_sessions_unused_for_the_limit_are_due_oldest_first_and_once() -> None:
    idle = IdleSessions(10.0)
    idle.touch("acme", "a", 0.0)
    idle.touch("acme", "b", 1.0)
    idle.touch("globex", "a", 2.0)
    assert idle.due(9.9) == []
    assert idle.due(11.0) == [("acme", "a"), ("acme", "b")]
    assert idle.due(11.0) == []  # forgotten once due: the caller closes them
    assert len(idle) == 1


def test_a_use_starts_the_wait_again() -> None:
    idle = IdleSessions(10.0)
    idle.touch("acme", "a", 0.0)
    idle.touch("acme", "b", 1.0)
    idle.touch("acme", "a", 5.0)  # used again: now the newest
    assert idle.due(12.0) == [("acme", "b")]
    assert idle.due(15.0) == [("acme", "a")]


def test_closed_and_erased_sessions_are_forgotten() -> None:
    idle = IdleSessions(1.0)
    idle.touch("acme", "a", 0.0)
    idle.touch("acme", "b", 0.0)
    idle.touch("globex", "a", 0.0)
    idle.forget("acme", "a")
    idle.forget("acme", "never")  # closing one never used is no error
    idle.forget_tenant("globex")
    assert idle.due(100.0) == [("acme", "b")]


def test_zero_keeps_every_session_for_good() -> None:
    idle = IdleSessions(0.0)
    idle.touch("acme", "a", 0.0)
    assert idle.due(1e12) == []
    with pytest.raises(ValueError, match="idle_s"):
        IdleSessions(-1.0)


def test_sweep_closes_what_is_due_counts_what_was_open_and_skips_an_erasure() -> None:
    idle = IdleSessions(1.0)
    for name in ("open", "gone", "erasing"):
        idle.touch("acme", name, 0.0)
    closed: list[str] = []

    def close(tenant: str, session: str) -> bool:
        if session == "erasing":
            raise TenantErased("the tenant is being erased")
        closed.append(session)
        return session == "open"  # "gone" was closed by its client meanwhile

    assert idle.sweep(5.0, close) == 1
    assert closed == ["open", "gone"] and idle.expired == 1 and len(idle) == 0


def test_the_setting_is_checked() -> None:
    assert load_config(env={}).controller.idle_session_s == 86400.0
    cfg = load_config(env={"AGENTKV_CONTROLLER_IDLE_SESSION_S": "0"})
    assert cfg.controller.idle_session_s == 0
    with pytest.raises(ConfigError, match="idle_session_s"):
        load_config(env={"AGENTKV_CONTROLLER_IDLE_SESSION_S": "-5"})
