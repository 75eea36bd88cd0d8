"""``api.tenant_workers`` (one tenant's share of the API threads) above ``api.workers``
(all of them) was taken silently, and ``api.tenant_connections`` above
``api.max_connections`` alike; each is refused in one line naming both values."""

from __future__ import annotations

import pytest

from agentkv_cluster.cli import main, serve
from agentkv_cluster.config import ConfigError, load_config


def test_a_tenant_share_above_the_workers_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"AGENTKV_API_TENANT_WORKERS": "100"})
    assert info.value.field == "api.tenant_workers"
    assert str(info.value) == ("api.tenant_workers: must be at most api.workers (64), got 100: "
                               "one tenant cannot hold more threads than there are (0: half "
                               "of them)")
    with pytest.raises(ConfigError, match=r"at most api.workers \(8\), got 9"):
        load_config(env={}, overrides={"api": {"workers": 8, "tenant_workers": 9}})


def test_a_tenant_connection_share_above_the_connections_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"AGENTKV_API_TENANT_CONNECTIONS": "300"})
    assert info.value.field == "api.tenant_connections"
    assert str(info.value) == ("api.tenant_connections: must be at most api.max_connections "
                               "(256), got 300: one tenant cannot hold more connections than "
                               "there are (0: half of them)")
    cfg = load_config(env={}, overrides={"api": {"max_connections": 8,
                                                 "tenant_connections": 8}})
    assert cfg.api.tenant_connections == 8


@pytest.mark.parametrize("share", [0, 1, 8])
def test_a_share_up_to_the_workers_is_taken(share: int) -> None:
    cfg = load_config(env={}, overrides={"api": {"workers": 8, "tenant_workers": share}})
    assert (cfg.api.workers, cfg.api.tenant_workers) == (8, share)


def test_serve_refuses_it_before_touching_the_state_dir(monkeypatch, tmp_path, capsys) -> None:
    started: list[object] = []  # never a real service, even where the check is missing
    monkeypatch.setattr(serve, "_serve", lambda cfg, _root: started.append(cfg) or 0)
    monkeypatch.setenv("AGENTKV_API_WORKERS", "16")
    monkeypatch.setenv("AGENTKV_API_TENANT_WORKERS", "32")
    state = tmp_path / "state"
    assert main(["serve", "--state-dir", str(state), "--port", "0", "--metrics-port", "0"]) == 2
    assert started == []
    assert capsys.readouterr().err == ("agentkv serve: error: api.tenant_workers: must be at "
                                       "most api.workers (16), got 32: one tenant cannot hold "
                                       "more threads than there are (0: half of them)\n")
    assert not state.exists()
