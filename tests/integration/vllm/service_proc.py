"""Run an AgentKV service (in-process actors, no Ray) until killed; for the vLLM tests.

    python -m tests.integration.vllm.service_proc WORKDIR SECRET_HEX

Writes ``WORKDIR/address`` ("host:port") once it listens. Pages up to 8 MiB: one vLLM
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
    (wd / "address.tmp").write_text(f"{host}:{port}")
    (wd / "address.tmp").rename(wd / "address")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:3])
