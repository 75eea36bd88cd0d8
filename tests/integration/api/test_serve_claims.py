"""``agentkv serve`` as an operator runs it, on its own folders: a second service on the
same state or NVMe directory is refused before Ray starts, naming the first one's pid; an
NVMe directory that cannot be one is a one-line error; and after ``kill -9`` a restart on
the same folders starts and serves the pages the first one had put in its tiers, exactly.

Real subprocesses (``python -m agentkv_cluster.cli serve``), each with its own local Ray.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentkv_cluster.api.client import AgentKvClient
from security.principals import TokenIssuer
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_serve_signals import _reader, _wait_for

pytestmark = pytest.mark.integration

SECRET = b"s" * 40
PAGES = 40
ENV = {"RAY_AUTH_MODE": "disabled", "AGENTKV_HBM_PAGE_BYTES": "131072",
       "AGENTKV_HBM_NUM_PAGES": "8", "AGENTKV_POOL_SLOT_BYTES": "131072",
       "AGENTKV_RAY_NUM_CPUS": "1", "AGENTKV_RAY_OBJECT_STORE_MEMORY": str(96 << 20)}


def _cmd(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentkv_cluster.cli", "serve", "--port", "0",
            "--metrics-port", "0", "--pool-bytes", str(1 << 20), "--state-dir",
            str(tmp_path / "state"), "--token-secret-file", str(tmp_path / "token.secret"),
            *extra]


def _refused(cmd: list[str]) -> str:
    """Run a serve that must be refused; its whole output (stdout and stderr)."""
    done = subprocess.run(cmd, env={**os.environ, **ENV}, capture_output=True, text=True,
                          timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out and "Started a local Ray" not in out, out
    return out


def _start(cmd: list[str]) -> tuple[subprocess.Popen, list[str], tuple[str, int]]:
    proc = subprocess.Popen(cmd, env={**os.environ, **ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    _reader(proc, lines)
    line = _wait_for(lines, "agentkv serving on", proc, 300)
    host, port = line.split("serving on ")[1].strip().rsplit(":", 1)
    return proc, lines, (host, int(port))


def _client(address: tuple[str, int]) -> AgentKvClient:
    token = TokenIssuer(SECRET).issue("acme", now=time.time(), ttl_s=600, subject="a")
    return AgentKvClient.connect(address, token)


def _page(i: int) -> dict:
    return kv_page(i, "evidence", identity("acme", "s1", 1000 * i))


def test_an_nvme_dir_that_is_a_file_is_refused_before_ray_starts(tmp_path: Path) -> None:
    (tmp_path / "token.secret").write_bytes(SECRET)
    (tmp_path / "afile").write_text("")
    out = _refused(_cmd(tmp_path, "--nvme-dir", str(tmp_path / "afile")))
    assert f"--nvme-dir {tmp_path / 'afile'} is a file, not a directory" in out


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_taken_port_is_refused_before_ray_starts(tmp_path: Path, flag: str) -> None:
    (tmp_path / "token.secret").write_bytes(SECRET)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [*_cmd(tmp_path, "--nvme-dir", str(tmp_path / "nvme")), flag, str(port)]
        out = _refused(cmd)
    assert f"{flag} {port}: 127.0.0.1:{port} is already in use" in out


def test_a_second_serve_is_refused_and_a_restart_after_kill_9_serves_what_was_stored(
        tmp_path: Path) -> None:
    (tmp_path / "token.secret").write_bytes(SECRET)
    nvme = tmp_path / "nvme"
    cmd = _cmd(tmp_path, "--nvme-dir", str(nvme))
    first, lines, address = _start(cmd)
    second = None
    try:
        with _client(address) as client:
            s = client.open_session("s1")
            for i in range(0, PAGES, 4):
                s.store_pages([_page(j) for j in range(i, i + 4)])
        # Same state and NVMe folders; another state folder on the same NVMe folder.
        out = _refused(cmd)
        assert f"in use by another agentkv serve (pid {first.pid})" in out, out
        other = _cmd(tmp_path, "--nvme-dir", str(nvme))
        other[other.index("--state-dir") + 1] = str(tmp_path / "state2")
        assert f"--nvme-dir {nvme} is in use" in _refused(other)
        with _client(address) as client:  # the first one is untouched
            assert client.open_session("s1").lookup_prefix(
                [identity("acme", "s1", 0).pack()])["length"] == 1

        first.send_signal(signal.SIGKILL)
        first.wait(60)
        second, lines, address = _start(cmd)  # no stale lock, the shard recovered
        ids = [identity("acme", "s1", 1000 * i).pack() for i in range(PAGES)]
        with _client(address) as client:
            s = client.open_session("s1")
            # Pages that were only in HBM died with the first process; the rest survive.
            # Each page is looked up on its own: which pages the policy kept in HBM (page 0
            # among them, or not) depends on timing, but stores beyond the HBM's room had
            # to push some out to the pool before they were answered.
            survived = [i for i, raw in enumerate(ids) if s.lookup_prefix([raw])["length"]]
            assert 0 < len(survived) <= PAGES
            for i in survived:
                (key,) = s.lookup_prefix([ids[i]])["keys"]
                assert s.load([key]) == [_page(i)["data"]]
                s.release([key])
        shm = Path("/dev/shm") / ("akv-node0-" + hashlib.blake2b(
            str(nvme / "node0").encode(), digest_size=6).hexdigest())
        assert shm.exists()  # the one the killed process left, taken over
        second.send_signal(signal.SIGINT)
        assert second.wait(90) == 0, "".join(lines)
        assert not shm.exists()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
