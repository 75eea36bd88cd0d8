"""The bundled Redis's rendered TLS config on a real redis-server, reached with the
rediss:// URL the chart gives the service (and so the pool actors)."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import time

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.integration.deploy import chart
from tests.integration.deploy.chart import SECRETS, service_config
from tests.support.redis_proc import free_port

pytestmark = pytest.mark.integration


def _cert(subject: str, issuer_key, issuer_name, key, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_tls_secret(folder):
    """tls.crt, tls.key, ca.crt: the keys of the chart's redis.bundled.tls Secret."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentkv-test-ca")])
    ca = _cert("agentkv-test-ca", ca_key, ca_name, ca_key, ca=True)
    server = _cert("agentkv-redis", ca_key, ca_name, key, ca=False)
    folder.mkdir()
    pem = serialization.Encoding.PEM
    (folder / "ca.crt").write_bytes(ca.public_bytes(pem))
    (folder / "tls.crt").write_bytes(server.public_bytes(pem))
    (folder / "tls.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def test_service_url_reaches_the_rendered_tls_redis(tmp_path):
    data = chart.one("production-8gpu-4node", "ConfigMap", "-redis")["data"]
    tls_dir = tmp_path / "tls"
    _write_tls_secret(tls_dir)
    port = free_port()
    password = SECRETS[("agentkv-redis-service", "password")]
    (tmp_path / "users.acl").write_text(
        f"user default on nopass ~* &* +@all\n"
        f"user agentkv on >{password} ~akv:* +@all\n")
    conf = (data["redis.conf"].replace("/etc/redis/tls", str(tls_dir))
            .replace("/etc/redis/acl/users.acl", str(tmp_path / "users.acl"))
            .replace("dir /data", f"dir {tmp_path}")
            .replace("tls-port 6379", f"tls-port {port}")
            .replace("bind 0.0.0.0", "bind 127.0.0.1"))
    assert "port 0" in conf.splitlines()  # no plaintext listener
    (tmp_path / "redis.conf").write_text(conf)
    proc = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cfg, _ = service_config("production-8gpu-4node", tmp_path)
        # The chart's URL, pointed at this server and this CA instead of the cluster's.
        url = (cfg.directory.redis_url
               .replace(f"{chart.RELEASE}-redis.{chart.NAMESPACE}.svc.cluster.local:6379",
                        f"127.0.0.1:{port}")
               .replace("/etc/agentkv/redis-ca/ca.crt", str(tls_dir / "ca.crt")))
        assert url.startswith("rediss://agentkv:")
        client = redis.Redis.from_url(url, socket_timeout=5)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert client.set("akv:{t}:e:1", b"v") and client.get("akv:{t}:e:1") == b"v"
        # Without the CA the server's certificate is refused.
        untrusted = redis.Redis(host="127.0.0.1", port=port, ssl=True, username="agentkv",
                                password=password, socket_timeout=5, retry=None)
        with pytest.raises(redis.ConnectionError):
            untrusted.ping()
    finally:
        proc.kill()
        proc.wait(timeout=10)
