"""``agentkv audit erased`` on a real redis-server: an admin checks that no erased tenant's
directory namespace holds a key (a Redis restored from a snapshot older than the erasure
would), from the erasure marks in the key directory and one SCAN of Redis."""

from __future__ import annotations

import pytest

from agentkv_cluster.cli import main
from security.audit import AuditLog
from security.blinding import DirectoryBlinder
from security.erasure import Eraser
from security.keyring import FileKeySource, TenantKeyring
from security.signing import Signer
from store.directory import DirectoryEntry
from store.directory.redis_backend import RedisDirectory
from store.types import Codec, Tier
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


def _publish(directory: RedisDirectory, ns: str, n: int) -> None:
    gen = directory.open_generation(ns)
    for i in range(n):
        directory.put(DirectoryEntry(key=bytes([i]) * 32, tenant_ns=ns, tier=Tier.HOST,
                                     node="node0", location=f"host:{i}", codec=Codec.FULL,
                                     size_bucket=3, generation=gen))


def test_a_namespace_left_in_redis_fails_the_check_until_it_is_gone(redis, tmp_path,
                                                                     capsys) -> None:
    keys = tmp_path / "keys"
    keyring = TenantKeyring(FileKeySource(keys))
    for tenant in ("acme", "globex"):
        keyring.create_tenant(tenant)
    blinder = DirectoryBlinder(keyring)
    erased, live = blinder.namespace("acme"), blinder.namespace("globex")
    directory = RedisDirectory(redis.url)
    _publish(directory, erased, 3)  # what a snapshot older than the erasure holds
    _publish(directory, live, 2)  # a live tenant's keys are none of the check's business
    signer = Signer.generate()
    audit = AuditLog(tmp_path / "audit.log", signer)
    Eraser(keyring, audit, signer).erase_tenant("acme", 1_700_000_000.0)  # no directory step
    keyring.mark_erased("oldco", 1_600_000_000.0)  # an erasure from before marks named it
    audit.close()
    args = ["audit", "erased", "--keys-dir", str(keys), "--redis-url", redis.url]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert f"FAIL acme ({erased})" in out and "key(s) left" in out
    assert "0/1 erased namespaces hold no key" in out
    assert "not checked (erased before marks named the namespace): oldco" in out
    assert directory.delete_namespace(erased) == 3
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"PASS acme ({erased}): no key left" in out
    assert "1/1 erased namespaces hold no key" in out and "globex" not in out
    directory.close()


@pytest.mark.parametrize(("flag", "value", "error"), [
    ("--redis-prefix", "a*", "--redis-prefix"),
    ("--keys-dir", "/nonexistent/keys", "does not exist"),
])
def test_bad_input_is_a_one_line_error(redis, tmp_path, capsys, flag, value, error) -> None:
    args = {"--keys-dir": str(tmp_path), "--redis-url": redis.url, "--redis-prefix": "akv"}
    args[flag] = value
    assert main(["audit", "erased", *[x for kv in args.items() for x in kv]]) == 2
    assert error in capsys.readouterr().err


def test_an_erasure_whose_end_the_log_refused_fails_until_it_is_finished(redis, tmp_path,
                                                                        capsys) -> None:
    """``--log``: an erasure whose last record a full disk refused (keys gone, no receipt)
    FAILs by name until running it again records its end (a real tmpfs, filled)."""
    from security.errors import ErasureUnrecorded
    from tests.support.tmpfs import fill, tmpfs

    with tmpfs(tmp_path / "fs", 1 << 20) as disk:
        keys = disk / "keys"
        keyring = TenantKeyring(FileKeySource(keys))
        keyring.create_tenant("acme")
        log = disk / "audit.log"
        signer = Signer.generate()
        audit = AuditLog(log, signer, checkpoint_every=1)
        eraser = Eraser(keyring, audit, signer)
        calls: list[object] = []

        def deleter(scope: object) -> int:
            calls.append(scope)
            if len(calls) == 1:
                fill(disk)  # the disk fills while the pages are deleted
            return 0

        eraser.register_tier("host", deleter)
        with pytest.raises(ErasureUnrecorded):
            eraser.erase_tenant("acme", 1_700_000_000.0)
        (disk / "ballast").unlink()
        args = ["audit", "erased", "--keys-dir", str(keys), "--redis-url", redis.url]
        assert main(args) == 0  # without the log: the marks alone, and Redis holds nothing
        capsys.readouterr()
        assert main([*args, "--log", str(log)]) == 1
        out = capsys.readouterr().out
        assert "FAIL erasure of tenant acme unfinished" in out and "no receipt" in out
        eraser.erase_tenant("acme", 1_700_000_001.0)  # run again: the end is recorded
        audit.close()
        assert main([*args, "--log", str(log)]) == 0
        assert "unfinished" not in capsys.readouterr().out
        assert main([*args, "--log", str(tmp_path / "missing.log")]) == 2
        assert "is not an audit log file" in capsys.readouterr().err


def test_the_prefix_defaults_to_the_services_as_tenant_erase_does(redis, tmp_path, capsys,
                                                                  monkeypatch) -> None:
    """A service run with ``AGENTKV_DIRECTORY_PREFIX`` keeps its entries under that prefix, and
    ``tenant erase --redis-url`` deletes there by the same default. ``audit erased`` without
    ``--redis-prefix`` looked under ``akv`` instead, found nothing and passed while the erased
    tenant's keys were still in Redis."""
    monkeypatch.setenv("AGENTKV_DIRECTORY_PREFIX", "custom")
    keys = tmp_path / "keys"
    keyring = TenantKeyring(FileKeySource(keys))
    keyring.create_tenant("acme")
    ns = DirectoryBlinder(keyring).namespace("acme")
    directory = RedisDirectory(redis.url, prefix="custom")
    _publish(directory, ns, 2)  # back from a snapshot older than the erasure
    signer = Signer.generate()
    audit = AuditLog(tmp_path / "audit.log", signer)
    Eraser(keyring, audit, signer).erase_tenant("acme", 1_700_000_000.0)
    audit.close()
    args = ["audit", "erased", "--keys-dir", str(keys), "--redis-url", redis.url]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert f"FAIL acme ({ns}):" in out and "key(s) left" in out
    assert main([*args, "--redis-prefix", "akv"]) == 0  # an explicit prefix still wins
    capsys.readouterr()
    assert directory.delete_namespace(ns) == 2
    assert main(args) == 0
    assert f"PASS acme ({ns}): no key left" in capsys.readouterr().out
    directory.close()
