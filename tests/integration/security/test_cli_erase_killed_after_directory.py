"""`agentkv tenant erase --redis-url` killed right after its directory step (a real
redis-server): the step deleted (and tombstoned) the tenant's namespace before the audit
log recorded anything, so a live tenant's later stores never reached Redis and neither
`audit verify` nor `audit erased --log` reported anything unfinished. The ``erasure.begun``
record now comes first: the erasure is listed unfinished, and the same command finishes it."""

from __future__ import annotations

import json

import pytest
import redis

import agentkv_cluster.cli._redis_admin as redis_admin
from agentkv_cluster.cli import main
from security.blinding import DirectoryBlinder
from security.keyring import FileKeySource, TenantKeyring

pytestmark = pytest.mark.integration


class _Killed(BaseException):
    """The erasing process dies here."""


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_erase_killed_after_its_directory_step_is_reported_and_finished_by_a_rerun(
        tmp_path, capsys, acl_redis, monkeypatch):
    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    assert _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)[0] == 0
    assert _run(capsys, "tenant", "create", "acme", "--keys-dir", keys)[0] == 0
    ring = TenantKeyring(FileKeySource(keys))
    namespace = DirectoryBlinder(ring).namespace("acme")
    admin = redis.Redis.from_url(acl_redis.url)
    admin.set(f"akv:{{{namespace}}}:e:1", b"entry")
    real = redis_admin.erase_namespace

    def erase_then_die(*args, **kwargs) -> int:
        real(*args, **kwargs)
        raise _Killed

    monkeypatch.setattr(redis_admin, "erase_namespace", erase_then_die)
    erase = ("tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
             "--signing-key", sk, "--redis-url", acl_redis.url)
    with pytest.raises(_Killed):
        main(list(erase))
    monkeypatch.undo()
    capsys.readouterr()
    assert admin.exists(f"akv:{{{namespace}}}:e:1") == 0 and ring.has_keys("acme")

    rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
    assert rc == 0 and "unfinished erasure of tenant acme" in out
    rc, out, _ = _run(capsys, "audit", "erased", "--keys-dir", keys, "--redis-url",
                      acl_redis.url, "--log", log)
    assert rc == 1 and "FAIL erasure of tenant acme unfinished" in out

    rc, out, err = _run(capsys, *erase)
    assert rc == 0, err
    receipt = json.loads(out)
    assert receipt["counts"] == [["directory", 0]] and not ring.has_keys("acme")
    rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
    assert rc == 0 and "unfinished" not in out
    admin.close()


def test_a_directory_step_that_fails_says_the_log_lists_the_erasure_unfinished(
        tmp_path, capsys, monkeypatch):
    """Redis refused: keys intact, the begun record stays, and the error says so."""
    from agentkv_cluster.cli import CliError

    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    assert _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)[0] == 0
    assert _run(capsys, "tenant", "create", "acme", "--keys-dir", keys)[0] == 0

    def refused(*_args, **_kwargs) -> int:
        raise CliError("Redis at redis://x refused: the tenant was not erased: its keys are "
                       "intact; run the same command again once that is fixed")

    monkeypatch.setattr(redis_admin, "erase_namespace", refused)
    rc, out, err = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, "--audit-log",
                        log, "--signing-key", sk, "--redis-url", "redis://x")
    assert (rc, out) == (2, "") and "its keys are intact" in err
    assert "`agentkv audit verify` lists the erasure as unfinished" in err
    assert TenantKeyring(FileKeySource(keys)).has_keys("acme")
    rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
    assert rc == 0 and "unfinished erasure of tenant acme" in out
