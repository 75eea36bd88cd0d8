"""``agentkv audit isolation`` against real redis-servers reached by a password URL, a unix
socket and TLS: the probe clients go where the admin URL goes, and no password is printed."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from agentkv_cluster.cli import main
from tests.support.redis_proc import RedisProcess, free_port
from tests.support.tls import write_tls_files

pytestmark = pytest.mark.integration


def _isolation(capsys, url: str) -> tuple[int, str]:
    rc = main(["audit", "isolation", "--redis-url", url, "--rounds", "10"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def _assert_clean(url: str) -> None:
    admin = redis.Redis.from_url(url)
    assert admin.dbsize() == 0 and admin.acl_users() == ["default"]  # the probes cleaned up
    admin.close()


@pytest.fixture
def server():
    proc = RedisProcess()
    yield proc
    proc.close()


def test_password_is_not_printed(server, capsys):
    server.extra_config = "requirepass S3cretPw"
    server.start()
    url = f"redis://default:S3cretPw@127.0.0.1:{server.port}/0"
    rc, text = _isolation(capsys, url)
    assert rc == 0 and "probes passed" in text
    assert "S3cretPw" not in text and f"redis://default:***@127.0.0.1:{server.port}/0" in text
    _assert_clean(url)


def test_probes_go_over_the_unix_socket(server, capsys):
    sock = server.workdir / "r.sock"
    server.extra_config = f"unixsocket {sock}\nunixsocketperm 700"
    server.start()
    rc, text = _isolation(capsys, f"unix://{sock}?db=0")
    assert rc == 0 and "FAIL" not in text and "probes passed" in text
    _assert_clean(f"unix://{sock}")


@pytest.fixture
def tls_url(tmp_path):
    """A redis-server with TLS only (no plaintext port) and the rediss:// URL that trusts it."""
    write_tls_files(tmp_path)
    port = free_port()
    (tmp_path / "redis.conf").write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {tmp_path}\n"
        f"tls-cert-file {tmp_path}/tls.crt\ntls-key-file {tmp_path}/tls.key\n"
        f"tls-ca-cert-file {tmp_path}/ca.crt\ntls-auth-clients no\n")
    proc = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp_path}/ca.crt"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_timeout=2).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_probes_keep_tls(tls_url, capsys):
    rc, text = _isolation(capsys, tls_url)
    assert rc == 0 and "FAIL" not in text and "probes passed" in text
    _assert_clean(tls_url)
