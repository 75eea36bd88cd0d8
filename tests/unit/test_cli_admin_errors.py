"""The admin CLI (``agentkv tenant`` / ``agentkv audit``) on bad input: one-line errors with exit
status 2 (or a FAIL line with 1), no traceback, and nothing destroyed or half written."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest

import security.signing
from agentkv_cluster.cli import main, redact_url
from agentkv_cluster.cli.audit import tenant_connector, tenant_url
from security.errors import InvalidSigningKey
from security.keyring import FileKeySource, TenantKeyring
from security.signing import write_keypair


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _erase(capsys, files: dict[str, str], *extra: str) -> tuple[int, str, str]:
    return _run(capsys, "tenant", "erase", "acme", "--keys-dir", files["keys"], "--audit-log",
                files["log"], "--signing-key", files["sk"], *extra)


# 1. tenant erase --receipt-out


def test_erase_refuses_an_unwritable_receipt_out_before_destroying_keys(tmp_path, capsys, admin_files):
    rc, out, err = _erase(capsys, admin_files, "--receipt-out", str(tmp_path / "missing" / "r.json"))
    assert rc == 2 and out == ""
    assert "--receipt-out" in err and "does not exist" in err and "Traceback" not in err
    assert TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("acme")  # nothing erased


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_erase_prints_the_receipt_even_when_writing_the_file_fails(capsys, admin_files):
    rc, out, err = _erase(capsys, admin_files, "--receipt-out", "/dev/full")  # writable, always full
    assert rc == 2 and "/dev/full could not be written" in err and "stdout" in err
    assert json.loads(out)["tenant"] == "acme"  # the signed receipt is not lost


# 2. audit keygen


def test_keygen_refuses_one_file_for_both_keys(tmp_path, capsys):
    same = str(tmp_path / "same.pem")
    rc, _, err = _run(capsys, "audit", "keygen", "--private", same, "--public", same)
    assert rc == 2 and "--private and --public are both" in err
    assert not Path(same).exists()
    with pytest.raises(InvalidSigningKey, match="cannot both be"):
        write_keypair(tmp_path / "a.pem", tmp_path / "." / "a.pem")


def test_keygen_writes_nothing_when_the_public_key_cannot_be_written(tmp_path, capsys):
    sk, pk = str(tmp_path / "sk.pem"), str(tmp_path / "missing" / "pk.pem")
    rc, _, err = _run(capsys, "audit", "keygen", "--private", sk, "--public", pk)
    assert rc == 2 and "--public" in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    rc, _, _ = _run(capsys, "audit", "keygen", "--private", sk, "--public", str(tmp_path / "pk.pem"))
    assert rc == 0  # a retry is not refused by a left-over private key


def test_write_keypair_removes_the_private_key_when_the_public_write_fails(tmp_path, monkeypatch):
    def fail(path, data, mode=0o644, *, fsync=True):
        raise OSError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(security.signing, "atomic_write", fail)
    with pytest.raises(OSError):
        write_keypair(tmp_path / "sk.pem", tmp_path / "pk.pem")
    assert list(tmp_path.iterdir()) == []


# 3. and 4. audit isolation: the password is redacted; probe clients keep the URL's transport


@pytest.mark.parametrize("url, shown", [
    ("redis://default:S3cretPw@127.0.0.1:1/0", "redis://default:***@127.0.0.1:1/0"),
    ("rediss://:pw@h:6380/0?ssl_cert_reqs=none", "rediss://:***@h:6380/0?ssl_cert_reqs=none"),
    ("unix://u:pw@/run/r.sock?db=1&password=zz", "unix://u:***@/run/r.sock?db=1&password=***"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_isolation_error_does_not_print_the_password(capsys):
    rc, out, err = _run(capsys, "audit", "isolation", "--redis-url",
                        "redis://default:S3cretPw@127.0.0.1:1/0")
    assert rc == 2 and "cannot reach Redis" in err
    assert "S3cretPw" not in out + err and "default:***@127.0.0.1:1" in err


def test_probe_clients_keep_tls_socket_and_options():
    redis = pytest.importorskip("redis")
    url = "rediss://admin:pw@10.0.0.1:6380/2?ssl_cert_reqs=none"
    assert tenant_url(url, "akv-u", "p/w") == "rediss://akv-u:p%2Fw@10.0.0.1:6380/2?ssl_cert_reqs=none"
    tenant = tenant_connector(redis.Redis.from_url(url), url)("akv-u", "p/w")
    pool = tenant.connection_pool
    assert pool.connection_class is redis.SSLConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("10.0.0.1", 6380, 2)
    assert (kwargs["username"], kwargs["password"], kwargs["ssl_cert_reqs"]) == ("akv-u", "p/w", "none")
    sock = tenant_connector(redis.Redis.from_url("unix:///run/r.sock?db=3"),
                            "unix:///run/r.sock?db=3")("u", "p")
    assert sock.connection_pool.connection_class is redis.UnixDomainSocketConnection
    assert sock.connection_pool.connection_kwargs["path"] == "/run/r.sock"


# 5. NaN / Infinity in receipts and logs; a directory as LOG; an uncreatable --keys-dir


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_receipt_with_a_non_finite_number_fails_cleanly(tmp_path, capsys, admin_files, value):
    rc, _, _ = _erase(capsys, admin_files, "--receipt-out", str(tmp_path / "r.json"))
    assert rc == 0
    r = tmp_path / "r.json"
    r.write_text(re.sub(r'"time": [0-9.e+]+', f'"time": {value}', r.read_text()))
    rc, out, err = _run(capsys, "audit", "receipt", str(r), "--public-key", admin_files["pk"])
    assert rc == 1 and out.startswith("FAIL") and "number" in out and "Traceback" not in out + err
    rc, out, err = _run(capsys, "audit", "verify", admin_files["log"], "--public-key",
                        admin_files["pk"], "--anchor", str(r))
    assert rc == 2 and "not a valid receipt" in err


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_audit_log_with_a_non_finite_number_fails_cleanly(tmp_path, capsys, admin_files, value):
    common = ("--keys-dir", admin_files["keys"], "--audit-log", admin_files["log"],
              "--signing-key", admin_files["sk"])
    assert _run(capsys, "tenant", "rotate", "acme", *common)[0] == 0
    log = Path(admin_files["log"])
    lines = log.read_text().splitlines(keepends=True)
    lines[0] = re.sub(r'"time":[0-9.e+]+', f'"time":{value}', lines[0])
    log.write_text("".join(lines))
    rc, out, _ = _run(capsys, "audit", "verify", str(log), "--public-key", admin_files["pk"])
    assert rc == 1 and out.startswith("FAIL") and "line 1:" in out and "number" in out
    rc, _, err = _run(capsys, "tenant", "create", "beta", *common)
    assert rc == 2 and "chain broken at line 1" in err and "refusing to append" in err
    assert not TenantKeyring(FileKeySource(admin_files["keys"])).has_keys("beta")


def test_verify_of_a_directory_is_a_clean_error(tmp_path, capsys, admin_files):
    (tmp_path / "audit").mkdir()
    rc, _, err = _run(capsys, "audit", "verify", str(tmp_path / "audit"), "--public-key",
                      admin_files["pk"])
    assert rc == 2 and "is a directory" in err


@pytest.mark.parametrize("where", ["under-a-file", "/proc/agentkv-nope/keys"])
def test_create_with_a_keys_dir_that_cannot_be_made(tmp_path, capsys, where):
    (tmp_path / "afile").write_text("x")
    keys = tmp_path / "afile" / "keys" if where == "under-a-file" else Path(where)
    rc, _, err = _run(capsys, "tenant", "create", "acme", "--keys-dir", str(keys))
    assert rc == 2 and "--keys-dir" in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").is_file()
    assert not Path("/proc/agentkv-nope").exists()


def test_create_removes_the_folders_it_made_when_a_deeper_one_fails(tmp_path, capsys, monkeypatch):
    real_mkdir = Path.mkdir

    def mkdir(self, mode=0o777, parents=False, exist_ok=False):
        if self.name == "keys":
            raise OSError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, mode, parents, exist_ok)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    rc, _, err = _run(capsys, "tenant", "create", "acme", "--keys-dir", str(tmp_path / "a" / "keys"))
    assert rc == 2 and "Permission denied" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tenant", ["nobody", "acme"], ids=["unknown", "erased-already"])
@pytest.mark.parametrize("redis", [False, True], ids=["keys-only", "with-redis-url"])
def test_erase_of_a_tenant_without_keys_says_so_whatever_the_options(
        capsys, admin_files, tenant, redis):
    """The same one line with or without ``--redis-url`` (which used to answer with the
    name of a missing key file, as it looked up the namespace first); no Redis is reached.
    A tenant the log records as erased gets that erasure's receipt again instead: the run
    that finished it may have died before it printed it (the rerun said "no keys", and
    nothing could sign it again)."""
    first = _erase(capsys, admin_files)[1] if tenant == "acme" else ""
    extra = ("--redis-url", "redis://127.0.0.1:1/0") if redis else ()
    rc, out, err = _run(capsys, "tenant", "erase", tenant, "--keys-dir", admin_files["keys"],
                        "--audit-log", admin_files["log"], "--signing-key", admin_files["sk"],
                        *extra)
    if tenant == "acme":
        assert (rc, out) == (0, first) and json.loads(out)["tenant"] == "acme"
        assert err.startswith("tenant acme: already erased (audit record ")
        return
    assert (rc, out) == (2, "")
    assert err == (f"agentkv tenant: error: tenant {tenant} has no keys (never created or "
                   "already erased)\n")


@pytest.mark.parametrize("tenant", ["nobody", "acme"], ids=["unknown", "erased"])
def test_rotate_of_a_tenant_without_keys_says_how_to_provision_it(capsys, admin_files, tenant):
    """After a tenant's erasure ``rotate`` said only "tenant acme has no keys", while
    ``create`` was what would provision it again."""
    if tenant == "acme":
        assert _erase(capsys, admin_files)[0] == 0
    rc, out, err = _run(capsys, "tenant", "rotate", tenant, "--keys-dir", admin_files["keys"])
    assert (rc, out) == (2, "")
    assert err.startswith(f"agentkv tenant: error: tenant {tenant} has no keys (never created "
                          "or already erased)")
    assert f"`agentkv tenant create {tenant}` provisions it" in err


@pytest.mark.parametrize("tenant", ["nobody", "acme"], ids=["unknown", "erased"])
def test_namespace_of_a_tenant_without_keys_says_so(capsys, admin_files, tenant):
    if tenant == "acme":
        assert _erase(capsys, admin_files)[0] == 0
    rc, out, err = _run(capsys, "tenant", "namespace", tenant, "--keys-dir", admin_files["keys"])
    assert (rc, out) == (2, "")
    assert err == (f"agentkv tenant: error: tenant {tenant} has no keys (never created or "
                   "already erased)\n")
