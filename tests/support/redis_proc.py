"""A real ``redis-server`` on loopback, started and stopped by tests.

Never fakeredis: it does not enforce ACLs. Each instance has its own port,
temporary directory and config, independent of any system server on 6379.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisProcess:
    """One redis-server process; ``restart()`` keeps the port (data is lost: no persistence)."""

    def __init__(self, extra_config: str = "", port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found; install it (apt-get install -y redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="agentkv-redis-"))
        self.extra_config = extra_config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        conf = self.workdir / "redis.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\n"
            f"dir {self.workdir}\nprotected-mode yes\n{self.extra_config}\n"
        )
        self.proc = subprocess.Popen(
            [self.binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    reply = sock.recv(64)
                    # An ACL-protected default user answers NOAUTH, which still proves liveness.
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> RedisProcess:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
