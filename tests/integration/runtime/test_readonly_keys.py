"""Tenant keys mounted read-only (a Kubernetes Secret): an unprovisioned tenant gets a
clear wire error naming it, provisioned tenants keep working, the server keeps serving."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from security.keyring import FileKeySource, TenantKeyring

pytestmark = pytest.mark.integration


def _read_only(path: Path) -> bool:
    """Make ``path`` read-only for this process: a ro bind mount as root, else chmod."""
    if os.geteuid() != 0:
        path.chmod(0o500)
        return True
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)],
                          check=False, capture_output=True)
    return done.returncode == 0


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-rokeys-"))
    keys = workdir / "keys"
    TenantKeyring(FileKeySource(keys)).create_tenant("acme")
    if not _read_only(keys):
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip("cannot make a read-only directory here (no mount privilege)")
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "security": {"tenant_keys_dir": str(keys)},
        "hbm": {"page_bytes": 1 << 16, "num_pages": 8},
        "pool": {"pool_bytes": 1 << 20, "slot_bytes": 1 << 16, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()
    if os.geteuid() == 0:
        subprocess.run(["umount", str(keys)], check=True)
    else:
        keys.chmod(0o700)
    shutil.rmtree(workdir, ignore_errors=True)


def test_unprovisioned_tenant_gets_clear_error_and_server_keeps_serving(service) -> None:
    with pytest.raises(OSError):  # the directory really is read-only
        (Path(service.keys_dir) / "probe").write_bytes(b"x")
    with service.client("globex") as stranger:
        with pytest.raises(RemoteError) as err:
            stranger.open_session("s1")
        assert err.value.code == "forbidden"
        assert "'globex' is not provisioned" in err.value.message
        with pytest.raises(RemoteError) as again:  # same connection still answers
            stranger.open_session("s2")
        assert again.value.code == "forbidden"
    assert sorted(os.listdir(service.keys_dir)) == sorted(
        n for n in os.listdir(service.keys_dir) if n.startswith("acme."))
    with service.client("acme") as client:  # a provisioned tenant is unaffected
        assert client.open_session("s1").session == "s1"
