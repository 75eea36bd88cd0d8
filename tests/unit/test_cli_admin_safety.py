"""The admin CLI never destroys what an operator cannot get back, and ends every run with a
deliberate status and one line (found probing it as an operator): a receipt or key path
never replaces a file (the audit log, a signing key, the public key old receipts verify
with); a malformed Redis option is refused before the erasure's begun record; an empty
audit log verifies; Ctrl-C and SIGTERM run the command's cleanup and exit 130; output
that cannot be written is one line that says how to get it again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agentkv_cluster.cli import main
from security.erasure import unfinished_erasures
from security.keyring import FileKeySource, TenantKeyring
from tests.unit.test_cli_admin_errors import _erase, _run

# 1. tenant erase --receipt-out naming the audit log or the signing key destroys it


@pytest.mark.parametrize("target", ["log", "sk"])
def test_erase_refuses_a_receipt_out_that_is_its_own_audit_log_or_signing_key(
        capsys, admin_files, target):
    _run(capsys, "tenant", "rotate", "acme", "--keys-dir", admin_files["keys"], "--audit-log",
         admin_files["log"], "--signing-key", admin_files["sk"])  # the log exists, with a record
    before = Path(admin_files[target]).read_bytes()
    rc, _, err = _erase(capsys, admin_files, "--receipt-out", admin_files[target])
    assert rc == 2 and "--receipt-out" in err and "Traceback" not in err
    assert Path(admin_files[target]).read_bytes() == before  # nothing overwritten
    assert TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("acme")  # nothing erased


# 2. audit keygen --public overwrites an existing file: a signing key, or the only public key


def test_keygen_refuses_a_public_path_that_holds_a_signing_key(tmp_path, capsys, admin_files):
    before = Path(admin_files["sk"]).read_bytes()
    rc, _, err = _run(capsys, "audit", "keygen", "--private", str(tmp_path / "new.pem"),
                      "--public", admin_files["sk"])
    assert rc == 2 and "--public" in err and "Traceback" not in err
    assert Path(admin_files["sk"]).read_bytes() == before  # the old signing key is kept
    assert not (tmp_path / "new.pem").exists()


def test_keygen_refuses_to_replace_an_existing_public_key(tmp_path, capsys, admin_files):
    before = Path(admin_files["pk"]).read_bytes()  # the key old receipts verify with
    rc, _, err = _run(capsys, "audit", "keygen", "--private", str(tmp_path / "new.pem"),
                      "--public", admin_files["pk"])
    assert rc == 2 and "--public" in err
    assert Path(admin_files["pk"]).read_bytes() == before


# 3. tenant erase with a malformed --redis-url / --redis-prefix: refused only after the
#    erasure's begun record, so the log lists an erasure that never could run


@pytest.mark.parametrize("extra", [["--redis-url", "notaurl"],
                                   ["--redis-url", "redis://h:notaport/0"],
                                   ["--redis-url", "redis://127.0.0.1:1", "--redis-prefix", "a*b"]],
                         ids=["scheme", "port", "prefix"])
def test_erase_refuses_a_malformed_redis_option_before_recording_anything(
        capsys, admin_files, extra):
    rc, out, err = _erase(capsys, admin_files, *extra)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("acme")
    log = Path(admin_files["log"])
    assert not log.exists() or unfinished_erasures(log) == []  # no erasure begun


# 4. audit isolation --keys-dir naming a file or a path that cannot be made: a traceback


@pytest.mark.parametrize("where", ["a-file", "/proc/agentkv-nope/keys"])
def test_isolation_with_a_keys_dir_that_cannot_be_used_is_a_clean_error(
        tmp_path, capsys, monkeypatch, where):
    import agentkv_cluster.cli._redis_admin as redis_admin

    monkeypatch.setattr(redis_admin, "connect_admin", lambda url: object())  # Redis answers
    keys = tmp_path / where if where == "a-file" else Path(where)
    if where == "a-file":
        keys.write_text("not a folder\n")
    rc, _, err = _run(capsys, "audit", "isolation", "--redis-url", "redis://127.0.0.1:1",
                      "--keys-dir", str(keys))
    assert rc == 2 and "--keys-dir" in err and len(err.strip().splitlines()) == 1


# 5. a log the service opened and closed with no record (serve started and stopped, nothing
#    happened) fails `audit verify`: no head file was ever signed for it


def test_an_idle_service_log_verifies(tmp_path, capsys, admin_files):
    from security.audit import AuditLog
    from security.signing import load_signer

    log = tmp_path / "audit.log"
    AuditLog(log, load_signer(admin_files["sk"])).close(now=1.0)  # what serve does, idle
    rc, out, _ = _run(capsys, "audit", "verify", str(log), "--public-key", admin_files["pk"])
    assert rc == 0 and out.startswith("PASS"), out


# 6. Ctrl-C of an admin command (an erase waiting for Redis, a long simulate): a
#    KeyboardInterrupt traceback of ~100 lines, and no word on what state it left


def test_ctrl_c_during_an_erase_is_one_line_and_a_deliberate_status(capsys, monkeypatch, admin_files):
    import agentkv_cluster.cli._redis_admin as redis_admin

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # the operator's Ctrl-C while the step waits for Redis

    monkeypatch.setattr(redis_admin, "erase_namespace", interrupted)
    try:
        rc = main(["tenant", "erase", "acme", "--keys-dir", admin_files["keys"], "--audit-log",
                   admin_files["log"], "--signing-key", admin_files["sk"],
                   "--redis-url", "redis://127.0.0.1:1"])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): a traceback for the operator")
    err = capsys.readouterr().err
    assert rc == 130 and len(err.strip().splitlines()) == 1
    assert TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("acme")


# 7. stdout that cannot be written (`agentkv tenant token acme ... > acme.token` on a full
#    disk; an erase's receipt to a full disk): an OSError traceback, not one line


class _FullStdout:
    """stdout on a full disk: every write fails as /dev/full does."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_token_to_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import sys

    secret = tmp_path / "token.secret"
    secret.write_text("ab" * 32)
    monkeypatch.setattr(sys, "stdout", _FullStdout())
    try:
        rc = main(["tenant", "token", "acme", "--token-secret-file", str(secret)])
    except OSError:
        pytest.fail("the write error escaped main(): a traceback for the operator")
    err = capsys.readouterr().err
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "No space left" in err


def test_erase_whose_receipt_cannot_be_printed_says_how_to_get_it(capsys, monkeypatch, admin_files):
    import sys

    monkeypatch.setattr(sys, "stdout", _FullStdout())
    try:
        rc = main(["tenant", "erase", "acme", "--keys-dir", admin_files["keys"], "--audit-log",
                   admin_files["log"], "--signing-key", admin_files["sk"]])
    except OSError:
        pytest.fail("the write error escaped main() after the keys were destroyed")
    err = capsys.readouterr().err
    assert rc != 0 and "agentkv tenant erase acme" in err  # a rerun prints the receipt again


def test_sigterm_during_an_erase_runs_its_cleanup_and_exits_130(capsys, monkeypatch,
                                                                admin_files):
    """SIGTERM (a pod stopped, `kill`) used to end the process at once: an isolation run
    left its probe ACL users in Redis. Now it unwinds like Ctrl-C, and the handler the
    process had before comes back."""
    import agentkv_cluster.cli._redis_admin as redis_admin

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
        pytest.fail("SIGTERM did not interrupt the command")

    def guard(signum, frame) -> None:  # without the CLI's own handler: a failure, not a kill
        pass

    monkeypatch.setattr(redis_admin, "erase_namespace", terminated)
    outer = signal.signal(signal.SIGTERM, guard)
    try:
        rc = main(["tenant", "erase", "acme", "--keys-dir", admin_files["keys"], "--audit-log",
                   admin_files["log"], "--signing-key", admin_files["sk"],
                   "--redis-url", "redis://127.0.0.1:1"])
        assert signal.getsignal(signal.SIGTERM) is guard
    finally:
        signal.signal(signal.SIGTERM, outer)
    err = capsys.readouterr().err
    assert rc == 130 and "interrupted" in err and len(err.strip().splitlines()) == 1
    assert TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("acme")


@pytest.mark.parametrize("rounds", ["9", "1000000000"])
def test_isolation_rounds_are_bounded(capsys, rounds):
    rc, _, err = _run(capsys, "audit", "isolation", "--redis-url", "redis://127.0.0.1:1",
                      "--rounds", rounds)
    assert rc == 2 and "--rounds" in err
