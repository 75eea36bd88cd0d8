"""The chart against the code it deploys: the service's config loader, the keyring's
file layout, and security/redis_acl.py's ACL rules on a real redis-server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from security.keyring import FileKeySource, TenantKeyring
from security.redis_acl import TenantAclUser, acl_file_line, acl_rules
from tests.integration.deploy import chart
from tests.integration.deploy.chart import POD_IP, REDIS_HOST, SECRETS
from tests.integration.deploy.chart import service_config as _service_config
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration


def _mounted(cont: dict, path: str) -> bool:
    return any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
               for m in cont["volumeMounts"])


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_service_config_loads_with_the_real_loader(value_set, tmp_path):
    cfg, agentkv = _service_config(value_set, tmp_path)
    values = chart.merged_values(value_set)
    assert cfg.role == "head"
    assert (cfg.api.host, cfg.api.port, cfg.api.require_auth) == ("0.0.0.0", 7420, True)
    assert (cfg.metrics.host, cfg.metrics.port) == ("0.0.0.0", 9420)
    assert cfg.ray.address == f"{POD_IP}:6379"
    assert cfg.pool.pool_bytes == values["pool"]["hostPoolBytes"]
    assert cfg.pool.slot_bytes == cfg.hbm.page_bytes == values["service"]["pageBytes"]
    assert cfg.pool.nvme_bytes == values["pool"]["nvme"]["bytes"]
    assert cfg.hbm.num_pages == values["gpuWorkers"]["hbmPagesPerGpu"]
    assert cfg.ray.object_store_memory == values["head"]["objectStoreBytes"]
    # Every file the service opens is mounted into its container.
    for path in (cfg.security.tenant_keys_dir, cfg.security.audit_key, cfg.security.audit_log,
                 cfg.security.token_secret_file, cfg.pool.nvme_dir):
        assert _mounted(agentkv, path), path
    # Pool actors run on every Ray node with the head's paths: they must exist there too.
    for name, template in chart.pod_templates(value_set).items():
        if name != "redis":
            ray = template["spec"]["containers"][0]
            assert _mounted(ray, cfg.security.tenant_keys_dir), name
            assert _mounted(ray, cfg.pool.nvme_dir), name


@pytest.mark.parametrize("value_set,scheme,host,port", [
    ("default", "redis", REDIS_HOST, 6379),
    ("production-8gpu-4node", "rediss", REDIS_HOST, 6379),
    ("external-redis-tls", "rediss", "redis.example.internal", 6380),
])
def test_directory_url_reaches_the_redis_the_chart_describes(value_set, scheme, host, port,
                                                             tmp_path):
    cfg, _ = _service_config(value_set, tmp_path)
    url = cfg.directory.redis_url
    assert url.startswith(f"{scheme}://")
    kwargs = parse_url(url)  # redis-py's own URL parser, as RedisDirectory uses
    assert (kwargs["host"], kwargs["port"], kwargs["username"]) == (host, port, "agentkv")
    if scheme == "rediss":
        ca = kwargs["ssl_ca_certs"]
        for name, template in chart.pod_templates(value_set).items():
            if name != "redis":
                assert _mounted(template["spec"]["containers"][0], ca), name
    if value_set != "external-redis-tls":
        assert kwargs["password"] == SECRETS[("agentkv-redis-service", "password")]
        svc = chart.one(value_set, "Service", "-redis")
        assert f"{svc['metadata']['name']}.{chart.NAMESPACE}.svc.cluster.local" == host
        assert svc["spec"]["ports"][0]["port"] == port


def test_embedded_directory_for_the_single_node_demo(tmp_path):
    cfg, _ = _service_config("cpu-demo", tmp_path)
    assert cfg.directory.redis_url is None
    assert cfg.hbm.resource == "hbm_slot"


def _kubelet_secret_volume(target: Path, files: dict[str, bytes]) -> None:
    """The layout kubelet's atomic writer gives a Secret volume: ..data -> a timestamped
    directory, and one symlink per key."""
    stamp = target / "..2026_11_29_10_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, data in files.items():
        (stamp / name).write_bytes(data)
    os.symlink(stamp.name, target / "..data")
    for name in files:
        os.symlink(f"..data/{name}", target / name)


def test_tenant_key_secrets_mount_in_the_keyrings_layout(tmp_path):
    # `agentkv tenant create/rotate` write these files; the operator turns them into a Secret.
    source = tmp_path / "created"
    keyring = TenantKeyring(FileKeySource(source))
    keyring.create_tenant("acme")
    keyring.rotate("acme")
    files = {p.name: p.read_bytes() for p in source.iterdir()}
    assert sorted(files) == ["acme.blind.key", "acme.g00000001.kek", "acme.g00000002.kek"]
    assert all(chart.SECRET_KEY_RE.fullmatch(name) for name in files)  # valid Secret keys
    mounted = tmp_path / "etc-agentkv-tenant-keys"
    _kubelet_secret_volume(mounted, files)
    pod_view = TenantKeyring(FileKeySource(mounted, writable=False))
    assert pod_view.generations("acme") == [1, 2]
    assert pod_view.key_id("acme", 2) == keyring.key_id("acme", 2)
    assert pod_view.blind_secret("acme") == keyring.blind_secret("acme")
    # The chart projects every listed Secret into that one directory on every Ray node.
    for name, template in chart.pod_templates("production-8gpu-4node").items():
        if name != "redis":
            volume = chart.volume(template, "tenant-keys")
            assert [s["secret"]["name"] for s in volume["projected"]["sources"]] == \
                ["agentkv-tenant-keys", "agentkv-tenant-keys-regulated"]


@pytest.fixture
def acl_build(tmp_path):
    """Run the chart's build-acl.sh (production values) against local password files."""
    data = chart.one("production-8gpu-4node", "ConfigMap", "-redis")["data"]
    passwords = {"admin": "admin-pw", "service": "svc-pw", "tenant-0": "acme-pw",
                 "tenant-1": "globex-pw"}
    for name, password in passwords.items():
        (tmp_path / "secrets" / name).mkdir(parents=True)
        # kubectl --from-file keeps a trailing newline; the script must not hash it.
        (tmp_path / "secrets" / name / "password").write_text(password + "\n")
    script = data["build-acl.sh"].replace("/secrets/", f"{tmp_path}/secrets/")
    script = script.replace("/etc/redis/acl/users.acl", f"{tmp_path}/users.acl")
    subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=30)
    lines = (tmp_path / "users.acl").read_text().splitlines()
    return lines, passwords, data["redis.conf"], tmp_path / "users.acl"


def test_acl_file_matches_security_redis_acl(acl_build):
    lines, _, _, _ = acl_build
    acme = TenantAclUser(username="akv-acme", password="acme-pw",
                         namespace="n4f1c2a9d0b3e5f6a7b8c9d0e")
    globex = TenantAclUser(username="akv-globex", password="globex-pw",
                           namespace="n0a1b2c3d4e5f60718293a4b5")
    assert lines[2:] == [acl_file_line(acme), acl_file_line(globex)]
    service = lines[1].split(" ")
    assert service[:3] == ["user", "agentkv", "on"]
    assert service[4:] == ["~akv:*"] + acl_rules(acme)[4:]  # same commands, every namespace
    assert lines[0].startswith("user default on #") and lines[0].endswith(" ~* &* +@all")


def test_acl_users_are_enforced_by_a_real_redis(acl_build):
    _, passwords, conf, acl_path = acl_build
    kept = [line for line in conf.splitlines()
            if line.split(" ")[0] in ("maxmemory", "maxmemory-policy")]
    server = RedisProcess(extra_config="\n".join(kept + [f"aclfile {acl_path}"])).start()
    try:
        def connect(user, password):
            # No retries: redis-py retries AuthenticationError (a ConnectionError) with backoff.
            return redis.Redis(host="127.0.0.1", port=server.port, username=user,
                               password=password, socket_timeout=5,
                               retry=Retry(NoBackoff(), 0))

        own, other = "akv:{n4f1c2a9d0b3e5f6a7b8c9d0e}:e:1", "akv:{n0a1b2c3d4e5f60718293a4b5}:e:1"
        acme = connect("akv-acme", passwords["tenant-0"])
        assert acme.set(own, b"x") and acme.get(own) == b"x"
        for denied in (lambda: acme.get(other), lambda: acme.scan(), lambda: acme.keys("*"),
                       lambda: acme.dbsize(), lambda: acme.config_get("*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        service = connect("agentkv", passwords["service"])
        assert service.set(other, b"y") and service.get(own) == b"x"
        with pytest.raises(redis.exceptions.NoPermissionError):
            service.acl_list()
        with pytest.raises(redis.exceptions.AuthenticationError):
            connect("akv-acme", "wrong").ping()
        admin = connect("default", passwords["admin"])
        assert len(admin.acl_list()) == 4
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    finally:
        server.close()


def test_bundled_redis_tls_uses_the_mounted_certificate():
    conf = chart.one("production-8gpu-4node", "ConfigMap", "-redis")["data"]["redis.conf"]
    assert "port 0" in conf.splitlines() and "tls-port 6379" in conf.splitlines()
    redis_pod = chart.pod_templates("production-8gpu-4node")["redis"]
    assert chart.volume(redis_pod, "tls")["secret"]["secretName"] == "agentkv-redis-tls"
    mounts = {m["name"]: m["mountPath"] for m in chart.container(redis_pod, "redis")["volumeMounts"]}
    for name in ("tls.crt", "tls.key", "ca.crt"):
        assert f" {mounts['tls']}/{name}" in conf
