"""Config loading: defaults < YAML < AGENTKV_* env < overrides; errors name the field."""

from __future__ import annotations

import dataclasses

import pytest

from agentkv_cluster.config import AgentKvConfig, ConfigError, load_config


def test_defaults_are_valid_and_frozen() -> None:
    cfg = load_config(env={})
    assert cfg == AgentKvConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.api.port = 1  # type: ignore[misc]


def test_precedence_yaml_env_override(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("api:\n  port: 8000\n  host: 0.0.0.0\ncredits:\n  per_link: 7\n")
    env = {"AGENTKV_API_PORT": "8001", "AGENTKV_POOL_FSYNC": "yes", "AGENTKV_ROLE": "pool",
           "AGENTKV_UNRELATED": "x"}
    cfg = load_config(path, env=env, overrides={"api": {"port": 8002, "host": None}})
    assert cfg.api.port == 8002
    assert cfg.api.host == "0.0.0.0"  # None override = flag not given
    assert cfg.credits.per_link == 7
    assert cfg.pool.fsync is True
    assert cfg.role == "pool"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"AGENTKV_API_PORT": "70000"}, "api.port"),
        ({"AGENTKV_API_PORT": "seven"}, "api.port"),
        ({"AGENTKV_CREDITS_PER_LINK": "0"}, "credits.per_link"),
        ({"AGENTKV_POOL_FSYNC": "maybe"}, "pool.fsync"),
        ({"AGENTKV_API_NOPE": "1"}, "api.nope"),
        ({"AGENTKV_ROLE": "boss"}, "role"),
        ({"AGENTKV_DIRECTORY_REDIS_URL": "http://x"}, "directory.redis_url"),
        ({"AGENTKV_CONTROLLER_POLICY": "fifo"}, "controller.policy"),
        ({"AGENTKV_POOL_SLOT_BYTES": str(1 << 40)}, "pool.slot_bytes"),
    ],
)
def test_validation_error_names_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")


def test_bad_yaml_and_unknown_section(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("api: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    assert info.value.field == "config"
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("gpu:\n  x: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(unknown, env={})
    assert info.value.field == "gpu"


def test_optional_fields_accept_none_spellings() -> None:
    cfg = load_config(env={"AGENTKV_DIRECTORY_REDIS_URL": "redis://127.0.0.1:7000/0",
                           "AGENTKV_POOL_NVME_DIR": "none"})
    assert cfg.directory.redis_url == "redis://127.0.0.1:7000/0"
    assert cfg.pool.nvme_dir is None


@pytest.mark.parametrize("url", [
    "rediss://agentkv:s3cret@redis:6380/0?ssl_cert_reqs=none",
    "rediss://agentkv:s3cret@redis:6380/0?ssl_ca_certs=/ca.crt&ssl_cert_reqs=OPTIONAL",
    "rediss://agentkv:s3cret@redis:6380/0?ssl_check_hostname=False",
    "http://agentkv:s3cret@redis:6380/0",
])
def test_a_redis_url_that_skips_verification_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"AGENTKV_DIRECTORY_REDIS_URL": url})
    assert info.value.field == "directory.redis_url"
    assert "s3cret" not in str(info.value)  # the URL holds the directory's password


def test_a_redis_url_that_verifies_is_accepted() -> None:
    for url in ("rediss://agentkv:pw@redis:6380/0?ssl_ca_certs=/ca.crt&ssl_cert_reqs=required",
                "redis://127.0.0.1:6379/0", "unix:///run/redis.sock"):
        assert load_config(env={"AGENTKV_DIRECTORY_REDIS_URL": url}).directory.redis_url == url
