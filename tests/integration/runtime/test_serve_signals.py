"""``agentkv serve`` as PID 1 in a pod: SIGTERM stops server, actors and Ray cleanly.

A real subprocess (``python -m agentkv_cluster.cli serve``) with its own local Ray.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agentkv_cluster.api.client import AgentKvClient
from security.principals import TokenIssuer

pytestmark = pytest.mark.integration

SECRET = b"s" * 40


def _reader(proc: subprocess.Popen, lines: list[str]) -> threading.Thread:
    def run() -> None:
        lines.extend(proc.stdout)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait_for(lines: list[str], text: str, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if text in line:
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not printed; output:\n{''.join(lines)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_serve_exits_cleanly_on_sigterm(tmp_path: Path, signum: int) -> None:
    secret = tmp_path / "token.secret"
    secret.write_bytes(SECRET)
    nvme = tmp_path / "nvme"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "AGENTKV_HBM_PAGE_BYTES": "131072",
           "AGENTKV_HBM_NUM_PAGES": "8", "AGENTKV_POOL_SLOT_BYTES": "131072",
           "AGENTKV_RAY_NUM_CPUS": "1", "AGENTKV_RAY_OBJECT_STORE_MEMORY": str(96 << 20)}
    cmd = [sys.executable, "-m", "agentkv_cluster.cli", "serve", "--port", "0",
           "--metrics-port", "0", "--pool-bytes", str(2 << 20), "--nvme-dir", str(nvme),
           "--tenant-keys-dir", str(tmp_path / "keys"), "--token-secret-file", str(secret)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    reader = _reader(proc, lines)
    try:
        line = _wait_for(lines, "agentkv serving on", proc, 300)
        host, port = line.split("serving on ")[1].strip().rsplit(":", 1)  # host:port
        token = TokenIssuer(SECRET).issue("acme", now=time.time(), ttl_s=600, subject="a")
        with AgentKvClient.connect((host, int(port)), token) as client:
            assert client.open_session("s1").session == "s1"
        shm = Path("/dev/shm") / ("akv-node0-" + hashlib.blake2b(
            str(nvme / "node0").encode(), digest_size=6).hexdigest())
        assert shm.exists()
        proc.send_signal(signum)
        assert proc.wait(90) == 0, "".join(lines)
        reader.join(10)
        out = "".join(lines)
        assert "SIGTERM, stopping" in out and "agentkv stopped" in out, out
        assert not shm.exists()  # the pool actor closed and unlinked its segment
        with pytest.raises(OSError):  # the wire port is closed
            socket.create_connection((host, int(port)), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
