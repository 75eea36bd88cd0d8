"""Which runtime files one resume runs: docs/architecture.md, "Follow one resume".

Starts the service in local mode (every actor in this process, real NIXL and /dev/shm, no
Ray), stores six pages in an HBM budget of three (so three go to the host pool), then
profiles every thread while the engine loads two pushed-out pages back
(``prepare_load`` + ``complete_load``) and prints each ``agentkv_cluster/runtime`` (and
``store/codecs``) file that ran, with the functions called in it.

    python scripts/resume_files.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page's geometry: 2 layers, 2 heads, 128 tokens, 64 dims
WATCHED = ("agentkv_cluster/runtime/", "store/codecs/")


def main() -> int:
    seen: dict[str, set[str]] = {}
    on = threading.Event()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and on.is_set():
            path = frame.f_code.co_filename
            for part in WATCHED:
                if part in path:
                    rel = part + path.split(part, 1)[1]
                    seen.setdefault(rel, set()).add(frame.f_code.co_name)

    workdir = Path(tempfile.mkdtemp(prefix="agentkv-resume-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 16 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")}})
    threading.setprofile(profile)  # every thread the service starts from here on
    svc = Service(cfg, workdir=workdir, hbm_capacity=3 * PAGE).start(local=True)
    try:
        with svc.client("acme") as client:
            session = client.open_session("resume")
            keys = session.store_pages([kv_page(i, "evidence", identity("acme", "resume", 1000 * i))
                                        for i in range(6)])
            sys.setprofile(profile)
            on.set()
            prepared = session.prepare_load(keys[:2])  # the first pages: pushed out to host
            done = session.complete_load(prepared["load_id"])
            on.clear()
            sys.setprofile(None)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    sources = [p["source"] for p in prepared["pages"]]
    print(f"loaded {len(done['pages'])} pages from {sources}")
    for path in sorted(seen):
        print(f"{path}: {', '.join(sorted(seen[path]))}")
    runtime = [p for p in seen if p.startswith(WATCHED[0])]
    print(f"{len(runtime)} runtime files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
