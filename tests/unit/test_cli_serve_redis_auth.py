"""``agentkv serve`` refuses, before Ray starts, a Redis that answers but refuses the URL's
credentials: it ran local-only and retried for ever, as in an outage, the misconfiguration
seen only in its log. An unreachable Redis still starts the service (the outage it rides
out). Real redis-servers, one with ``requirepass``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkv_cluster.cli import main, serve
from tests.support.redis_proc import RedisProcess, free_port

PASSWORD = "s3cret-pass"


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[RedisProcess]:
    server = RedisProcess(extra_config=f"requirepass {PASSWORD}").start()
    yield server
    server.close()


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What would have started Ray and the service: recorded instead."""
    calls: list[str] = []
    monkeypatch.setattr(serve, "_serve", lambda cfg, _root: calls.append(
        cfg.directory.redis_url) or 0)
    for name in ("AGENTKV_DIRECTORY_REDIS_URL", "AGENTKV_API_PORT", "AGENTKV_METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _serve(url: str, state: Path) -> int:
    return main(["serve", "--redis-url", url, "--state-dir", str(state), "--port", "0",
                 "--metrics-port", "0"])


def test_a_wrong_password_is_refused_before_ray_starts(guarded_redis, started, tmp_path,
                                                        capsys) -> None:
    url = f"redis://default:wrong-one@127.0.0.1:{guarded_redis.port}/0"
    assert _serve(url, tmp_path / "state") == 2
    assert started == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "wrong-one" not in err
    assert err.startswith(f"agentkv serve: error: --redis-url redis://default:***@127.0.0.1:"
                          f"{guarded_redis.port}/0: Redis refuses its credentials (")


def test_no_password_where_one_is_required_is_refused(guarded_redis, started, tmp_path,
                                                      capsys) -> None:
    assert _serve(guarded_redis.url, tmp_path / "state") == 2
    assert started == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Redis requires a password and the URL gives none" in err


def test_the_right_password_starts_the_service(guarded_redis, started, tmp_path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis.port}/0"
    assert _serve(url, tmp_path / "state") == 0
    assert started == [url]


def test_an_unreachable_redis_still_starts_the_service(started, tmp_path, capsys) -> None:
    url = f"redis://default:whatever@127.0.0.1:{free_port()}/0"  # nothing listens there
    assert _serve(url, tmp_path / "state") == 0
    assert started == [url]
    assert "error" not in capsys.readouterr().err
