"""The bundled Redis's rendered TLS config on a real redis-server, reached with the
rediss:// URL the chart gives the service (and so the pool actors)."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from tests.integration.deploy import chart
from tests.integration.deploy.chart import SECRETS, service_config
from tests.support.redis_proc import free_port
from tests.support.tls import write_tls_files

pytestmark = pytest.mark.integration


def test_service_url_reaches_the_rendered_tls_redis(tmp_path):
    data = chart.one("production-8gpu-4node", "ConfigMap", "-redis")["data"]
    tls_dir = tmp_path / "tls"
    write_tls_files(tls_dir, "agentkv-redis")  # the chart's redis.bundled.tls Secret
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
