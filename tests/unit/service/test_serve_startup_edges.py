"""Operator-facing edges of ``agentkv serve`` found from outside: each ended in a traceback,
a hang, an unnamed file or another service's lock."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentkv_cluster.cli import CliError
from agentkv_cluster.cli.serve import state_dir, token_secret
from agentkv_cluster.config import ConfigError, load_config
from agentkv_cluster.runtime import ray_start
from agentkv_cluster.runtime.wiring import pool_spec


def test_an_oversized_size_is_a_config_error_not_a_traceback() -> None:
    """``AGENTKV_POOL_POOL_BYTES=1`` and 400 zeros: int(inf) raised OverflowError."""
    with pytest.raises(ConfigError, match="pool.pool_bytes: not a size: .*too large"):
        load_config(env={"AGENTKV_POOL_POOL_BYTES": "1" + "0" * 400})


def test_a_short_token_secret_names_its_file(tmp_path: Path) -> None:
    cfg = load_config(env={})
    (tmp_path / "token.secret").write_bytes(b"")  # a crash between create and write, before
    with pytest.raises(CliError, match=f"token secret in {tmp_path}/token.secret must be at "
                                       "least 32 bytes, it holds 0"):
        token_secret(cfg, tmp_path)


def test_a_generated_token_secret_is_whole_and_kept(tmp_path: Path) -> None:
    cfg = load_config(env={})
    secret, source = token_secret(cfg, tmp_path)
    assert source.endswith("(generated)") and len(secret) == 64
    assert token_secret(cfg, tmp_path)[0] == secret  # read back on the next start
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token.secret"]  # no temp left
    assert (tmp_path / "token.secret").stat().st_mode & 0o777 == 0o600


def test_two_services_from_other_folders_get_their_own_pool_segment(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """``serve --state-dir st`` run from two folders hashed the same relative path into one
    /dev/shm name: the second failed a minute later on the first's writer lock."""
    names = []
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        cfg = load_config(env={}, overrides={"state": {"dir": "st"}})
        root = state_dir(cfg)
        assert root == tmp_path / where / "st"
        names.append(pool_spec(cfg, "node0", root).shm_name)
    assert names[0] != names[1]


def test_an_unreachable_ray_address_is_refused_at_once() -> None:
    """``ray.init`` retried it for minutes, with nothing of AgentKV's own said."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(RuntimeError, match=f"Ray cluster at 127.0.0.1:{port} is not reachable"):
        ray_start._check_reachable(f"127.0.0.1:{port}")
    ray_start._check_reachable("auto")  # Ray resolves these itself
    ray_start._check_reachable("ray://head:10001")


def test_ray_init_does_not_take_the_process_signal_handlers(monkeypatch) -> None:
    """ray.init installs an aborting SIGTERM handler: a pod stopped during the rest of its
    start ended in a stack dump (exit 134), not a clean stop."""
    def ours(_signum, _frame) -> None:
        return None

    def init(**_kwargs) -> None:  # what ray.init does to the handlers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    fake = SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setattr(ray_start, "_ray", lambda: fake)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, ours)
        signal.signal(signal.SIGINT, ours)
        ray_start.start_ray(load_config(env={}))
        assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGINT) is ours
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert os.environ.get("RAY_USAGE_STATS_ENABLED") is not None


def test_a_misspelled_section_is_named_not_silently_ignored(caplog) -> None:
    """``AGENTKV_APII_PORT=1`` started on the default port without a word, while an unknown
    field of a known section is refused."""
    with caplog.at_level("WARNING", logger="agentkv_cluster.config"):
        cfg = load_config(env={"AGENTKV_APII_PORT": "1", "AGENTKV_VLLM_STATS": "/tmp/s"})
    assert cfg.api.port == 7420
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith(
        "AGENTKV_APII_PORT is not a setting (no section 'apii'; sections: api, ")


def test_readyz_waits_for_the_directory_watch_to_recover() -> None:
    """After an outage /readyz said ready as soon as Redis answered, seconds before the
    watch had erased again what a snapshot may have brought back (the docs: ready after)."""
    from agentkv_cluster.runtime.directory_watch import DirectoryWatch, ready

    watch = DirectoryWatch(lambda: (True, "directory ok"))
    embedded = object()  # answers at once: only the watch decides here
    assert ready(embedded, None) == (True, "directory ok")
    watch.up = False  # an outage seen, its recovery not done
    recovering = "directory: reachable again, recovering from the outage"
    assert ready(embedded, watch) == (False, recovering)
    watch.up = True
    assert ready(embedded, watch) == (True, "directory ok")


def test_an_object_store_below_rays_floor_is_refused_at_load() -> None:
    """Ray refuses less than 75 MiB, but only once ray.init ran, after every check passed."""
    with pytest.raises(ConfigError, match="ray.object_store_memory: must be >= 78643200"):
        load_config(env={"AGENTKV_RAY_OBJECT_STORE_MEMORY": "64MiB"})
    assert load_config(env={"AGENTKV_RAY_OBJECT_STORE_MEMORY": "75MiB"}).ray.object_store_memory \
        == 75 << 20


def test_a_yaml_error_is_one_line_naming_the_file_and_where(tmp_path: Path) -> None:
    """It was the parser's eight lines, naming ``"<unicode string>"`` instead of the file."""
    config = tmp_path / "agentkv.yaml"
    config.write_text("api:\n  port: 7420\n pool: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(config, env={})
    text = str(err.value)
    assert str(config) in text and "line 3" in text and "\n" not in text
    assert "unicode string" not in text


@pytest.mark.parametrize("url", ["redis://127.0.0.1:notaport", "redis://127.0.0.1:70000/0"])
def test_a_redis_url_with_a_bad_port_is_refused_before_ray(url: str) -> None:
    """It was refused only after Ray started, as the controller actor's ``ValueError``."""
    with pytest.raises(ConfigError, match="directory.redis_url: its port is not a number"):
        load_config(env={"AGENTKV_DIRECTORY_REDIS_URL": url})


def test_a_unix_socket_in_a_missing_folder_is_refused_before_ray(tmp_path: Path) -> None:
    from agentkv_cluster.cli.serve import prepare_state

    cfg = load_config(env={"AGENTKV_STATE_DIR": str(tmp_path / "s"),
                           "AGENTKV_API_UNIX_PATH": str(tmp_path / "nope" / "agentkv.sock")})
    with pytest.raises(CliError, match=f"api.unix_path .*: folder {tmp_path / 'nope'} does not"):
        prepare_state(cfg)


def test_a_negative_demo_seed_is_refused(capsys) -> None:
    from agentkv_cluster.cli import main

    assert main(["demo", "--seed", "-1"]) == 2
    assert "--seed must be >= 0" in capsys.readouterr().err
