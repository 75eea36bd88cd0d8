"""`agentkv serve` as an operator runs it, in its own process with its own local Ray:

- started against a Redis URL where nothing listens, it says so in the banner and logs the
  outage at error level, retrying with backoff; requests run local-only (stores and prefix
  lookups succeed); once a real redis-server starts there, it logs the recovery and
  republishes what the pools hold, and /readyz turns ready;
- a restart with the same --state-dir keeps the token secret and the tenant keys, so tokens
  issued before the restart still work.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis as redis_py

from agentkv_cluster.api.client import AgentKvClient
from security.principals import TokenIssuer
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.redis_proc import RedisProcess, free_port

pytestmark = pytest.mark.integration

ENV = {  # a small service: HBM for 4 pages of 128 KiB, a 16 MiB pool
    "AGENTKV_API_PORT": "0", "AGENTKV_METRICS_PORT": "0", "AGENTKV_HBM_PAGE_BYTES": "256KiB",
    "AGENTKV_HBM_NUM_PAGES": "2", "AGENTKV_POOL_SLOT_BYTES": "256KiB",
    "AGENTKV_POOL_POOL_BYTES": "16MiB", "AGENTKV_POOL_NVME_BYTES": "64MiB",
    "AGENTKV_RAY_NUM_CPUS": "2", "AGENTKV_DIRECTORY_RETRY_MAX_S": "2",
    "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
}


class Serve:
    """One `agentkv serve` process; stderr is collected line by line."""

    def __init__(self, state: Path, *flags: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTKV_", "RAY_"))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentkv_cluster.cli", "serve", "--state-dir", str(state),
             *flags], env={**env, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.err: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        banner = []
        deadline = time.monotonic() + 240
        while not banner or not banner[-1].startswith("  token"):
            assert time.monotonic() < deadline, "no banner"
            line = self.proc.stdout.readline()
            assert line, f"serve exited: {''.join(self.err[-20:])}"
            if banner or line.startswith("agentkv serving on"):
                banner.append(line.rstrip("\n"))
        self.banner = "\n".join(banner)
        host, port = re.search(r"serving on (\S+):(\d+)", self.banner).groups()
        self.address = (host, int(port))
        self.metrics = re.search(r"metrics\s+(http://\S+)/metrics", self.banner).group(1)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)

    def wait_log(self, pattern: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.err):
                if re.search(pattern, line):
                    return line
            time.sleep(0.1)
        raise AssertionError(f"no log line /{pattern}/ in:\n{''.join(self.err[-30:])}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.metrics + path, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


def _token(state: Path, tenant: str) -> str:
    secret = (state / "token.secret").read_bytes().strip()
    return TokenIssuer(secret).issue(tenant, subject="test", now=time.time(), ttl_s=3600)


def _entries(url: str) -> list[bytes]:
    admin = redis_py.Redis.from_url(url)
    try:
        return [k for k in admin.keys("akv:*") if b":e:" in k]
    finally:
        admin.close()


def _wait_entries(url: str, at_least: int, timeout_s: float = 60.0) -> int:
    """How many entries Redis holds once it holds ``at_least`` (the pools republish them)."""
    deadline = time.monotonic() + timeout_s
    while (n := len(_entries(url))) < at_least:
        assert time.monotonic() < deadline, f"{n} entries republished, {at_least} expected"
        time.sleep(0.2)
    return n


def test_unreachable_redis_is_logged_retried_and_recovered(tmp_path) -> None:
    state = tmp_path / "state"
    redis = RedisProcess(port=free_port())  # not started: nothing listens on its port
    serve = Serve(state, "--redis-url", redis.url)
    try:
        assert "directory  redis UNREACHABLE (local-only, retrying)" in serve.banner
        assert f"state      {state}" in serve.banner
        assert "(" not in serve.banner.splitlines()[0]  # host:port, not a Python tuple
        line = serve.wait_log(r"ERROR .*directory unreachable.*retrying in")
        assert "local-only" in line
        code, body = serve.get("/readyz")
        assert code == 503 and "directory unreachable" in body

        token = _token(state, "acme")
        ids = [identity("acme", "s1", 128 * i) for i in range(8)]
        with AgentKvClient.connect(serve.address, token) as client:
            s = client.open_session("s1")
            # 8 pages into HBM room for 4: the oldest go to the pool, which cannot publish them.
            keys = s.store_pages([kv_page(i, "evidence", ids[i]) for i in range(8)])
            assert len(keys) == 8  # stores succeed while the directory is away
            assert s.lookup_prefix([i.pack() for i in ids])["length"] == 8  # local-only
            assert "agentkv_directory_up 0.0" in serve.get("/metrics")[1]

            redis.start()
            serve.wait_log(r"directory reachable again")
            republished = _wait_entries(redis.url, 4)  # the pools wrote them after all
            assert serve.get("/readyz")[0] == 200
            assert "agentkv_directory_up 1.0" in serve.get("/metrics")[1]
            assert s.lookup_prefix([i.pack() for i in ids])["length"] == 8

            # Restarted empty between two probes (they are 5 s apart): no probe fails, yet
            # the entries are gone; the watch must notice and have the pools republish.
            redis.restart()
            serve.wait_log(r"ERROR .*directory lost its entries since the last probe")
            _wait_entries(redis.url, republished)  # each pool's repair loop refills it
            assert s.lookup_prefix([i.pack() for i in ids])["length"] == 8

            # Full (maxmemory reached, noeviction): still up and ready, but it refuses
            # writes, and the head says so in its log and its gauge until it accepts them.
            full = 'agentkv_directory_refuses_writes{reason="out_of_memory"} 1.0'
            admin = redis_py.Redis.from_url(redis.url)
            try:
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", 1)
                serve.wait_log(r"ERROR .*directory answers reads but refuses writes")
                assert full in serve.get("/metrics")[1]
                assert serve.get("/readyz")[0] == 200
                admin.config_set("maxmemory", 0)
                serve.wait_log(r"directory accepts writes again")
                assert full not in serve.get("/metrics")[1]
            finally:
                admin.close()
    finally:
        rc = serve.stop()
        redis.close()
    assert rc == 0, "".join(serve.err)

    # The same state directory: same token secret, same tenant keys; old tokens still work.
    keys_before = sorted(p.name for p in (state / "keys").iterdir())
    assert any(n.startswith("acme.") for n in keys_before)
    again = Serve(state)
    try:
        assert f"token      {state / 'token.secret'}" in again.banner
        assert "generated" not in again.banner
        with AgentKvClient.connect(again.address, token) as client:
            client.open_session("s2")
    finally:
        assert again.stop() == 0
    assert sorted(p.name for p in (state / "keys").iterdir()) == keys_before
