"""Run an AgentKV service (in-process actors, no Ray) until killed; for the vLLM tests.

    python -m tests.integration.vllm.service_proc WORKDIR SECRET_HEX

Writes ``WORKDIR/address`` ("host:port") once it listens, and ``WORKDIR/pages`` (how many
pages it holds) every 0.2 s, so a test can wait for the engine's asynchronous saves. Pages up to 8 MiB: one vLLM
CPU block of SmolLM2-135M at float32 is 30 layers x 128 tokens x 3 heads x 128 x 4 B.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service


def main(workdir: str, secret_hex: str) -> None:
    wd = Path(workdir)
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": 8 << 20, "num_pages": 24},
        "pool": {"pool_bytes": 256 << 20, "slot_bytes": 8 << 20, "nvme_dir": str(wd / "nv")},
    })
    svc = Service(cfg, workdir=wd, token_secret=bytes.fromhex(secret_hex)).start(local=True)
    host, port = svc.address
    _publish(wd / "pages", str(svc.stats()["pages"]))
    _publish(wd / "address", f"{host}:{port}")
    while True:
        time.sleep(0.2)
        _publish(wd / "pages", str(svc.stats()["pages"]))


def _publish(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
