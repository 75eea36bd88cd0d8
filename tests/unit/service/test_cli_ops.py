"""The command line as operators meet it: --version, help on every flag, sizes with units,
the environment listed in `serve --help`, readable banners, state that survives a restart,
and bad paths refused in one line before anything runs."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentkv_cluster.cli import CliError, ProgressLines, build_parser, main
from agentkv_cluster.cli.serve import config_from_args, format_address, prepare_state, token_secret
from agentkv_cluster.config import ConfigError, default_state_dir, env_variables, load_config

REPO = Path(__file__).resolve().parents[3]


def _parsers(parser: argparse.ArgumentParser, path: str = "agentkv"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == "agentkv 0.1.0"


def test_every_flag_of_every_command_has_help() -> None:
    missing = [f"{path} {action.option_strings[0]}"
               for path, parser in _parsers(build_parser())
               for action in parser._actions
               if action.option_strings and not action.help]
    assert missing == []


def test_serve_help_lists_every_environment_variable() -> None:
    out = subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", "serve", "--help"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    names = [name for name, _, _ in env_variables()]
    assert "AGENTKV_STATE_DIR" in names and "AGENTKV_POOL_POOL_BYTES" in names
    assert [n for n in names if n not in out] == []


@pytest.mark.parametrize(("text", "nbytes"), [
    ("16GiB", 16 << 30), ("512MiB", 512 << 20), ("4Gi", 4 << 30), ("1.5GB", 1_500_000_000),
    ("4096", 4096), ("64 KiB", 64 << 10), ("0x1000", 4096)])
def test_sizes_accept_units(text: str, nbytes: int, monkeypatch) -> None:
    # Pages and pool slots of 4 KiB: a host pool of any of these sizes holds a page.
    monkeypatch.setenv("AGENTKV_HBM_PAGE_BYTES", "4096")
    monkeypatch.setenv("AGENTKV_POOL_SLOT_BYTES", "4096")
    args = build_parser().parse_args(["serve", "--pool-bytes", text, "--nvme-bytes", "64GiB"])
    cfg = config_from_args(args)
    assert (cfg.pool.pool_bytes, cfg.pool.nvme_bytes) == (nbytes, 64 << 30)
    frame = str(max(64 << 20, 2 * nbytes))  # a page must fit one wire frame
    assert load_config(env={"AGENTKV_HBM_PAGE_BYTES": text, "AGENTKV_POOL_SLOT_BYTES": text,
                            "AGENTKV_POOL_POOL_BYTES": str(max(512 << 20, nbytes)),
                            "AGENTKV_POOL_NVME_BYTES": str(2 * nbytes + (1 << 20)),
                            "AGENTKV_API_MAX_FRAME_BYTES": frame}).hbm.page_bytes == nbytes


@pytest.mark.parametrize("text", ["16GB!", "GiB", "1.5", "12XB", "-4GiB"])
def test_bad_sizes_name_the_field(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"AGENTKV_POOL_NVME_BYTES": text})
    assert info.value.field == "pool.nvme_bytes"


def test_banner_addresses_are_readable() -> None:
    assert format_address(("127.0.0.1", 7420)) == "127.0.0.1:7420"
    assert format_address(("::1", 7420, 0, 0)) == "[::1]:7420"
    assert format_address("/run/agentkv.sock") == "unix:/run/agentkv.sock"


def test_state_dir_defaults_to_xdg_state_home(tmp_path) -> None:
    assert default_state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "agentkv"
    assert default_state_dir({}) == Path.home() / ".local" / "state" / "agentkv"
    cfg = load_config(env={"AGENTKV_STATE_DIR": str(tmp_path / "s")})
    assert prepare_state(cfg) == tmp_path / "s"
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o700


def test_serve_never_replaces_a_public_key_whose_signing_key_is_gone(tmp_path) -> None:
    """The service generates its audit key pair in the state directory when there is none;
    with audit.pub left alone (the signing key lost or moved) that used to overwrite the
    only key that verifies the receipts signed before."""
    cfg = load_config(env={"AGENTKV_STATE_DIR": str(tmp_path)})
    (tmp_path / "audit.pub").write_bytes(b"the old public key")
    with pytest.raises(CliError, match="audit.pub is there without its signing key"):
        prepare_state(cfg)
    assert (tmp_path / "audit.pub").read_bytes() == b"the old public key"


def test_the_token_secret_survives_a_restart(tmp_path) -> None:
    cfg = load_config(env={"AGENTKV_STATE_DIR": str(tmp_path)})
    root = prepare_state(cfg)
    first, where = token_secret(cfg, root)
    assert where.endswith("(generated)") and len(first) >= 32
    assert (root / "token.secret").stat().st_mode & 0o777 == 0o600
    again, where = token_secret(cfg, root)  # the next start of serve
    assert again == first and where == str(root / "token.secret")


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    return subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", "serve", *flags],
                          check=False, capture_output=True, text=True, timeout=60,
                          env=env)


def test_bad_paths_fail_in_one_line_before_anything_starts(tmp_path) -> None:
    binary = tmp_path / "config.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    cases = [
        (("--config", str(binary)), "not a text (YAML) file"),
        (("--keys-dir", str(a_file)), "is a file, not a directory"),
        (("--audit-log", str(tmp_path)), "is a directory, not a file"),
        (("--state-dir", str(a_file)), "--state-dir"),
        (("--signing-key", str(tmp_path / "none.pem")), "not a readable file"),
    ]
    for flags, message in cases:
        done = _serve(tmp_path, *flags)
        assert done.returncode == 2, (flags, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (flags, done.stderr)


def test_deprecated_flag_names_still_work() -> None:
    new = build_parser().parse_args(["serve", "--keys-dir", "k", "--signing-key", "s"])
    old = build_parser().parse_args(["serve", "--tenant-keys-dir", "k", "--audit-key", "s"])
    assert (new.tenant_keys_dir, new.audit_key) == (old.tenant_keys_dir, old.audit_key)


@pytest.mark.parametrize("argv", [
    ["simulate", "--batches", "50", "--json", "{tmp}"],
    ["simulate", "--batches", "50", "--json", "{tmp}/missing/out.json"],
    ["simulate", "--batches", "50", "--sweep", "budget", "--out-dir", "{tmp}/plain/sub"],
    ["demo", "--json", "{tmp}/missing/out.json"],
])
def test_unwritable_outputs_fail_before_the_run(argv: list[str], tmp_path, capsys) -> None:
    (tmp_path / "plain").write_text("a file where a folder should be")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2  # returns at once: no simulation, no Ray
    err = capsys.readouterr().err
    assert "error:" in err and str(tmp_path) in err


def test_progress_lines_when_output_is_not_a_terminal() -> None:
    lines: list[str] = []
    now = [0.0]
    bar = ProgressLines("simulating", 100, every_s=10.0, write=lines.append, clock=lambda: now[0])
    for _ in range(30):
        now[0] += 1.0
        bar.advance(3)
    assert lines == ["simulating: 30/100 (30%) after 10 s", "simulating: 60/100 (60%) after 20 s",
                     "simulating: 90/100 (90%) after 30 s"]
    bar.advance(10)
    assert lines[-1] == "simulating: 100/100 (100%) after 30 s"


def test_simulate_prints_progress_lines_into_a_pipe() -> None:
    done = subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", "simulate", "--batches",
                           "40", "--policies", "lru"], check=False, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^simulating: (\d+)/\1 \(100%\) after \d+ s$", done.stderr, re.MULTILINE), \
        done.stderr


def test_tenant_and_audit_use_the_state_dir_serve_uses(tmp_path, monkeypatch, capsys) -> None:
    """One state directory for serve, tenant and audit: keys, token secret, audit key pair
    and log are found there when their options are not given."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("AGENTKV_STATE_DIR", raising=False)
    root = tmp_path / "agentkv"
    cfg = load_config(env={"XDG_STATE_HOME": str(tmp_path)})
    monkeypatch.setattr("agentkv_cluster.config.default_state_dir",
                        lambda env=None: root)
    assert prepare_state(cfg) == root  # what `agentkv serve` creates
    token_secret(cfg, root)
    assert main(["tenant", "create", "acme"]) == 0
    assert (root / "keys" / "acme.blind.key").is_file()
    assert main(["audit", "keygen", "--private", str(root / "audit.key"),
                 "--public", str(root / "audit.pub")]) == 0
    assert main(["tenant", "rotate", "acme"]) == 0  # recorded: the state dir holds audit.key
    assert main(["tenant", "token", "acme"]) == 0
    capsys.readouterr()
    assert main(["tenant", "erase", "acme", "--receipt-out", str(tmp_path / "r.json")]) == 0
    assert main(["audit", "verify"]) == 0
    assert main(["audit", "receipt", str(tmp_path / "r.json"), "--log",
                 str(root / "audit.log")]) == 0
    out = capsys.readouterr().out
    assert f"PASS {root / 'audit.log'}" in out and "holds the erasure record" in out
    other = tmp_path / "elsewhere"
    assert main(["tenant", "create", "globex", "--state-dir", str(other)]) == 0
    assert (other / "keys" / "globex.blind.key").is_file()


def test_demo_progress_without_a_terminal_prints_plain_lines(capsys) -> None:
    from agentkv_cluster.cli.demo import _LineProgress

    progress = _LineProgress()
    tasks = {p: progress.add_task(f"{p:8s}", total=2) for p in ("agentkv", "lru")}
    for task in tasks.values():
        progress.advance(task)
        progress.advance(task)
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" after ")[0] for line in err if "2/2" in line] == [
        "demo agentkv resumes: 2/2 (100%)", "demo lru resumes: 2/2 (100%)"]
