"""The admin CLI end to end: real key files, audit log, receipts and a real redis-server."""

from __future__ import annotations

import json

import pytest
import redis

from agentkv_cluster.cli import main
from store.directory.redis_backend import TOMBSTONES

pytestmark = pytest.mark.integration

_TOMBSTONES = f"akv:{{{TOMBSTONES}}}:erased".encode()  # what erasures leave (one key)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_tenant_lifecycle_and_offline_verification(tmp_path, capsys):
    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    assert _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)[0] == 0
    admin = ("--audit-log", log, "--signing-key", sk)
    assert _run(capsys, "tenant", "create", "acme", "--keys-dir", keys, *admin)[0] == 0
    rc, out, _ = _run(capsys, "tenant", "rotate", "acme", "--keys-dir", keys, *admin)
    assert rc == 0 and out.strip() == "key.rotate: tenant acme generation 2"
    rc, out, _ = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, *admin, "--generation", "1",
                      "--receipt-out", str(tmp_path / "g1.json"))
    assert rc == 0 and json.loads(out)["key_ids"][0].startswith("acme/g1/")
    rc, out, _ = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, *admin,
                      "--receipt-out", str(tmp_path / "all.json"))
    assert rc == 0 and json.loads(out)["scope"] == "tenant"
    rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk,
                      "--anchor", str(tmp_path / "g1.json"), "--anchor", str(tmp_path / "all.json"))
    assert rc == 0 and out.startswith("PASS") and "records" in out
    rc, out, err = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, *admin)
    assert rc == 0 and "already erased" in err  # that erasure's receipt again
    assert out == (tmp_path / "all.json").read_text()
    # Tampering with the log is reported, with exit status 1.
    lines = (tmp_path / "audit.log").read_text().splitlines(keepends=True)
    (tmp_path / "audit.log").write_text("".join(lines[:2] + lines[3:]))
    rc, out, _ = _run(capsys, "audit", "verify", log, "--public-key", pk)
    assert rc == 1 and "FAIL" in out and "expected" in out


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"tenant": "acme"}', b"\xff\xfe"])
def test_malformed_receipt_is_a_clean_failure(tmp_path, capsys, content):
    pk = tmp_path / "pk.pem"
    assert _run(capsys, "audit", "keygen", "--private", str(tmp_path / "sk.pem"), "--public", str(pk))[0] == 0
    (tmp_path / "r.json").write_bytes(content)
    rc, out, err = _run(capsys, "audit", "receipt", str(tmp_path / "r.json"), "--public-key", str(pk))
    assert rc == 1 and out.startswith("FAIL") and "Traceback" not in out + err


def test_bad_key_files_are_user_errors(tmp_path, capsys):
    (tmp_path / "pk.pem").write_text("not a key")
    (tmp_path / "r.json").write_text("{}")
    rc, _, err = _run(capsys, "audit", "receipt", str(tmp_path / "r.json"), "--public-key",
                      str(tmp_path / "pk.pem"))
    assert rc == 2 and "not a PEM Ed25519 public key" in err
    rc, _, err = _run(capsys, "audit", "receipt", str(tmp_path / "r.json"), "--public-key",
                      str(tmp_path / "missing.pem"))
    assert rc == 2 and "cannot read public key" in err
    rc, _, err = _run(capsys, "tenant", "rotate", "acme", "--keys-dir", str(tmp_path / "nope"))
    assert rc == 2 and "does not exist" in err
    rc, _, err = _run(capsys, "tenant", "create", "Bad Name", "--keys-dir", str(tmp_path / "k"))
    assert rc == 2 and "invalid tenant" in err


def test_isolation_probes_against_a_live_server(acl_redis, capsys):
    rc, out, _ = _run(capsys, "audit", "isolation", "--redis-url", acl_redis.url, "--rounds", "50",
                      "--tool-name", "web_search")
    assert rc == 0, out
    assert "FAIL" not in out and "probes passed" in out
    assert out.count("PASS") >= 20
    admin = redis.Redis.from_url(acl_redis.url)
    assert admin.dbsize() == 0 and admin.acl_users() == ["default"]  # the probes cleaned up
    admin.close()


def test_isolation_probes_fail_against_a_leaky_server(acl_redis, capsys):
    admin = redis.Redis.from_url(acl_redis.url)
    admin.set("akv:tenant-acme:page-1", '{"tool": "web_search", "len": 54321}')
    rc, out, _ = _run(capsys, "audit", "isolation", "--redis-url", acl_redis.url, "--rounds", "20",
                      "--tool-name", "web_search")
    admin.close()
    assert rc == 1 and "FAIL" in out


def test_isolation_unreachable_server(capsys):
    rc, _, err = _run(capsys, "audit", "isolation", "--redis-url", "redis://127.0.0.1:1/0")
    assert rc == 2 and "cannot reach Redis" in err


def test_isolation_against_a_redis_whose_persistence_fails_says_so(capsys):
    """Under ``MISCONF`` Redis refuses PING as well as writes: it answered, so the CLI says
    what it refuses, not that it could not reach it."""
    from tests.support.redis_refusals import failing_persistence

    with failing_persistence() as (url, _lift):
        rc, _, err = _run(capsys, "audit", "isolation", "--redis-url", url)
    assert rc == 2 and "refuses writes (persistence_failing" in err, err
    assert "cannot reach" not in err


def test_erase_deletes_the_tenants_directory_keys(tmp_path, capsys, acl_redis):
    from security.blinding import DirectoryBlinder
    from security.keyring import FileKeySource, TenantKeyring

    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)
    for tenant in ("acme", "globex"):
        assert _run(capsys, "tenant", "create", tenant, "--keys-dir", keys)[0] == 0
    blinder = DirectoryBlinder(TenantKeyring(FileKeySource(keys)))
    admin = redis.Redis.from_url(acl_redis.url)
    for tenant in ("acme", "globex"):
        for i in range(3):
            admin.set(blinder.directory_key(tenant, bytes([i]) * 32), b"entry")
    rc, out, _ = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
                      "--signing-key", sk, "--redis-url", acl_redis.url)
    assert rc == 0 and json.loads(out)["counts"] == [["directory", 3]]
    remaining = sorted(k for k in admin.keys("*") if k != _TOMBSTONES)
    assert len(remaining) == 3 and all(blinder.namespace("globex").encode() in k for k in remaining)
    assert admin.zrange(_TOMBSTONES, 0, -1) == [blinder.namespace("acme").encode()]
    admin.close()


def test_erase_follows_the_services_directory_prefix(tmp_path, capsys, acl_redis):
    """A service with ``directory.prefix`` writes ``<prefix>:{ns}:*``; the erasure deletes
    those (it used to scan ``akv:`` whatever the prefix, delete nothing and still report
    the directory tier done), and refuses a prefix that is a glob."""
    from security.blinding import DirectoryBlinder
    from security.keyring import FileKeySource, TenantKeyring

    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)
    assert _run(capsys, "tenant", "create", "acme", "--keys-dir", keys)[0] == 0
    blinder = DirectoryBlinder(TenantKeyring(FileKeySource(keys)))
    admin = redis.Redis.from_url(acl_redis.url)
    for i in range(2):
        admin.set(b"custom:" + blinder.directory_key("acme", bytes([i]) * 32)[4:], b"entry")
    args = ("tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
            "--signing-key", sk, "--redis-url", acl_redis.url)
    rc, _, err = _run(capsys, *args, "--redis-prefix", "*")
    assert rc == 2 and "--redis-prefix" in err
    rc, out, _ = _run(capsys, *args, "--redis-prefix", "custom")
    assert rc == 0 and json.loads(out)["counts"] == [["directory", 2]]
    # Only the erasure tombstones are left, under the service's prefix (store/directory).
    assert admin.keys("*") == [_TOMBSTONES.replace(b"akv:", b"custom:")]
    admin.close()


def test_erase_with_an_unreachable_redis_destroys_no_key(tmp_path, capsys):
    """The directory step runs first: a Redis that stays away leaves every key in place,
    no receipt, and the same command completes the erasure once Redis answers (a
    failing tier still yielding a receipt is the Eraser's, tests/unit/security)."""
    keys, log, sk, pk = (str(tmp_path / n) for n in ("keys", "audit.log", "sk.pem", "pk.pem"))
    _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)
    _run(capsys, "tenant", "create", "acme", "--keys-dir", keys)
    rc, out, err = _run(capsys, "tenant", "erase", "acme", "--keys-dir", keys, "--audit-log", log,
                        "--signing-key", sk, "--redis-url", "redis://127.0.0.1:1/0",
                        "--retry-s", "0", "--receipt-out", str(tmp_path / "r.json"))
    assert (rc, out) == (2, "") and "the tenant was not erased: its keys are intact" in err
    assert not (tmp_path / "r.json").exists()
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "acme.blind.key", "acme.g00000001.kek"]
