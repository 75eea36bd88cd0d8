"""``agentkv tenant erase --retry-s``: bad values are refused in one line before anything is
erased or any Redis is reached; its default is the service's own erasure retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv_cluster.cli import main
from agentkv_cluster.runtime.erasure import DIRECTORY_RETRY_S
from security.keyring import FileKeySource, TenantKeyring
from security.signing import write_keypair


@pytest.fixture
def erase_argv(tmp_path: Path) -> list[str]:
    write_keypair(tmp_path / "sk.pem", tmp_path / "pk.pem")
    TenantKeyring(FileKeySource(tmp_path / "keys")).create_tenant("acme")
    return ["tenant", "erase", "acme", "--keys-dir", str(tmp_path / "keys"), "--audit-log",
            str(tmp_path / "ops.log"), "--signing-key", str(tmp_path / "sk.pem")]


def _still_there(argv: list[str]) -> bool:
    return TenantKeyring(FileKeySource(argv[4])).has_keys("acme")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "86401"])
def test_a_bad_retry_s_is_refused_before_anything_is_erased(capsys, erase_argv, value) -> None:
    rc = main([*erase_argv, "--redis-url", "redis://127.0.0.1:1/0", f"--retry-s={value}"])
    out = capsys.readouterr()
    assert (rc, out.out) == (2, "")
    assert out.err == ("agentkv tenant: error: --retry-s must be a number of seconds in "
                       "[0, 86400]\n")
    assert _still_there(erase_argv)


def test_retry_s_without_redis_url_is_refused(capsys, erase_argv) -> None:
    rc = main([*erase_argv, "--retry-s", "5"])
    out = capsys.readouterr()
    assert (rc, out.out) == (2, "") and "--retry-s goes with --redis-url" in out.err
    assert _still_there(erase_argv)


def test_retry_s_zero_tries_once_and_waits_for_nothing(capsys, erase_argv) -> None:
    rc = main([*erase_argv, "--redis-url", "redis://127.0.0.1:1/0", "--retry-s", "0"])
    out = capsys.readouterr()
    assert (rc, out.out) == (2, "") and "retrying" not in out.err
    assert "could not be reached within --retry-s 0" in out.err
    assert _still_there(erase_argv)


def test_the_default_is_the_services_erasure_retry(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["tenant", "erase", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"(default: as the service's own erasure, {DIRECTORY_RETRY_S:g})" in shown
