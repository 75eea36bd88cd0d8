"""A whole AgentKV service in this process (local mode: no Ray; real NIXL, shared memory,
files and encryption), for tests that exercise the API front and the runtime together."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service


@contextmanager
def local_service(prefix: str, *, page_bytes: int, hbm_pages: int, pool_bytes: int,
                  controller: dict[str, Any] | None = None, hbm: dict[str, Any] | None = None,
                  pool: dict[str, Any] | None = None, api: dict[str, Any] | None = None,
                  metrics_http: bool = False, **service: Any) -> Iterator[Service]:
    """A started service with ``hbm_pages`` arena pages of ``page_bytes`` and a host pool
    of ``pool_bytes`` (slots of one page) over an NVMe shard in a fresh work dir, which
    goes when the service stops. ``controller``, ``hbm``, ``pool``, ``api``: more settings
    of those sections; ``metrics_http``: serve ``/metrics`` on a free port; ``service``: more
    ``Service`` arguments."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0, **(api or {})},
        "hbm": {"page_bytes": page_bytes, "num_pages": hbm_pages, **(hbm or {})},
        "pool": {"pool_bytes": pool_bytes, "slot_bytes": page_bytes,
                 "nvme_dir": str(workdir / "nv"), **(pool or {})},
        "controller": controller or {},
        "metrics": {"port": 0},
    })
    svc = Service(cfg, workdir=workdir, **service).start(local=True, metrics_http=metrics_http)
    try:
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
