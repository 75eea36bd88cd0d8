"""``agentkv tenant token`` and ``agentkv tenant namespace``, and ``python -m agentkv_cluster.cli``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentkv_cluster.cli import main
from security.blinding import DirectoryBlinder
from security.errors import InvalidToken
from security.keyring import FileKeySource, TenantKeyring
from security.principals import TokenIssuer

SECRET = b"k" * 48


def test_token_verifies_with_the_serve_secret(tmp_path: Path, capsys) -> None:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")  # serve strips the trailing newline too
    assert main(["tenant", "token", "acme", "--token-secret-file", str(path), "--ttl", "60"]) == 0
    token = capsys.readouterr().out.strip()
    principal = TokenIssuer(SECRET).verify(token, time.time())
    assert (principal.tenant, principal.subject) == ("acme", "agent")
    assert 0 < principal.expires - time.time() <= 60
    with pytest.raises(InvalidToken):
        TokenIssuer(b"x" * 48).verify(token, time.time())
    with pytest.raises(InvalidToken):  # expired after its ttl
        TokenIssuer(SECRET).verify(token, time.time() + 61)


@pytest.mark.parametrize("argv, message", [
    (["--ttl", "0"], "--ttl must be a number of seconds in (0,"),
    (["--ttl", "inf"], "--ttl must be a number of seconds in (0,"),
    (["--ttl", "nan"], "--ttl must be a number of seconds in (0,"),
    (["--ttl", str(400 * 86400)], "--ttl must be a number of seconds in (0,"),
    (["--ttl", "60", "--short"], "at least 32 bytes"),
])
def test_token_refuses_bad_input(tmp_path: Path, capsys, argv, message) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"short" if "--short" in argv else SECRET)
    argv = [a for a in argv if a != "--short"]
    assert main(["tenant", "token", "acme", "--token-secret-file", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_namespace_matches_the_blinder_and_reads_only(tmp_path: Path, capsys) -> None:
    keys = tmp_path / "keys"
    ring = TenantKeyring(FileKeySource(keys))
    ring.create_tenant("acme")
    assert main(["tenant", "namespace", "acme", "--keys-dir", str(keys)]) == 0
    assert capsys.readouterr().out.strip() == DirectoryBlinder(ring).namespace("acme")
    names = sorted(p.name for p in keys.iterdir())
    assert main(["tenant", "namespace", "globex", "--keys-dir", str(keys)]) == 2
    assert "globex" in capsys.readouterr().err
    assert sorted(p.name for p in keys.iterdir()) == names  # nothing created


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", "tenant", "--help"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "namespace" in done.stdout


def test_bad_paths_and_urls_are_errors_not_tracebacks(tmp_path: Path, capsys) -> None:
    from security.signing import write_keypair

    a_file = tmp_path / "plain"
    a_file.write_text("x")
    assert main(["tenant", "create", "acme", "--keys-dir", str(a_file)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    keys = tmp_path / "keys"
    TenantKeyring(FileKeySource(keys)).create_tenant("acme")
    write_keypair(tmp_path / "audit.key", tmp_path / "audit.pub")
    audit = ["--signing-key", str(tmp_path / "audit.key")]
    assert main(["tenant", "erase", "acme", "--keys-dir", str(keys), "--audit-log",
                 str(tmp_path), *audit]) == 2
    assert "is a directory, not a file" in capsys.readouterr().err
    assert main(["tenant", "erase", "acme", "--keys-dir", str(keys), "--audit-log",
                 str(tmp_path / "audit.log"), *audit, "--redis-url", "notaurl"]) == 2
    assert "--redis-url 'notaurl'" in capsys.readouterr().err
    assert TenantKeyring(FileKeySource(keys)).generations("acme") == [1]  # nothing erased


def test_erasing_a_tenant_that_never_existed_leaves_no_mark(tmp_path: Path, capsys) -> None:
    from security.signing import write_keypair

    keys = tmp_path / "keys"
    TenantKeyring(FileKeySource(keys)).create_tenant("acme")
    write_keypair(tmp_path / "audit.key", tmp_path / "audit.pub")
    before = sorted(p.name for p in keys.iterdir())
    assert main(["tenant", "erase", "nobody", "--keys-dir", str(keys), "--audit-log",
                 str(tmp_path / "audit.log"), "--signing-key", str(tmp_path / "audit.key")]) == 2
    assert "no keys" in capsys.readouterr().err
    assert sorted(p.name for p in keys.iterdir()) == before
