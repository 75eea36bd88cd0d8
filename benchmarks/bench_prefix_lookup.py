"""Cross-node prefix sharing: ``lookup_prefix`` of a prefix another node's pool holds.

A real two-node Ray cluster (one machine), a real redis-server, the service with the
AgentKV policy. Per round, session A stores ``--pages`` fixed-prefix pages (written
through to its node's pool and published in the directory); session B, placed on the
other node, looks the whole prefix up, which adopts every page from A's pool. Side by
side in the same round: the same lookup made one page per call (what an engine that
asks block by block pays). Prints each round's times and the medians' ratio.

    python benchmarks/bench_prefix_lookup.py [--pages 32] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.ray_cluster import NODE, ray_cluster
from tests.support.redis_proc import RedisProcess

PAGE = 1 << 17  # kv_page's geometry: 2 layers, 2 heads, 128 tokens, 64 dims, float16


def _other_node(client, name: str, hbm: str):
    """A session of ``client`` that the service placed on another HBM actor than ``hbm``."""
    for k in range(64):
        s = client.open_session(f"{name}-{k}")
        if client.call("open_session", {"session": f"{name}-{k}"})["hbm"] != hbm:
            return s
    raise RuntimeError("every session landed on one node")


def _round(client, r: int, pages: int) -> tuple[float, float]:
    """(one lookup of the whole prefix, the same pages one per call), in seconds."""
    times = []
    for mode in ("whole", "per page"):
        name = f"{mode[0]}{r}"
        a = client.open_session(f"{name}-a")
        hbm = client.call("open_session", {"session": f"{name}-a"})["hbm"]
        base = 1_000_000 * r + (500_000 if mode == "per page" else 0)
        ids = [identity("acme", "", base + 128 * i) for i in range(pages)]
        a.store_pages([kv_page(i, "fixed_prefix", ids[i]) for i in range(pages)])
        time.sleep(1.0)  # the write-through copies reach the pool and the directory
        b = _other_node(client, f"{name}-b", hbm)
        t = time.perf_counter()
        if mode == "whole":
            found = b.lookup_prefix([i.pack() for i in ids])["length"]
        else:
            found = sum(b.lookup_prefix([i.pack()])["length"] for i in ids)
        times.append(time.perf_counter() - t)
        if found != pages:
            raise RuntimeError(f"{mode}: found {found} of {pages} pages")
    return times[0], times[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    redis = RedisProcess().start()
    try:
        with ray_cluster(NODE, NODE) as cluster:
            workdir = Path(tempfile.mkdtemp(prefix="agentkv-lookup-"))
            cfg = load_config(env={}, overrides={
                "api": {"port": 0}, "ray": {"address": cluster.address},
                "directory": {"redis_url": redis.url},
                "hbm": {"page_bytes": PAGE, "num_pages": 8 * args.pages},
                "pool": {"pool_bytes": 4 * args.pages * args.rounds * PAGE, "slot_bytes": PAGE,
                         "nvme_dir": str(workdir / "nv")}})
            svc = Service(cfg, workdir=workdir, policy="agentkv",
                          hbm_capacity=6 * args.pages * PAGE).start()
            try:
                client = svc.client("acme")
                rows = []
                for r in range(args.rounds):
                    rows.append(_round(client, r, args.pages))
                    print(f"round {r + 1}/{args.rounds}: whole prefix {rows[-1][0] * 1e3:7.1f} ms"
                          f" | one page per call {rows[-1][1] * 1e3:7.1f} ms", flush=True)
            finally:
                svc.stop()
    finally:
        redis.close()
    steady = rows[1:] or rows  # the first round also warms the actors' connections
    whole = statistics.median(w for w, _ in steady)
    each = statistics.median(p for _, p in steady)
    print(f"{args.pages} pages adopted from the other node: whole prefix {whole * 1e3:.1f} ms, "
          f"one page per call {each * 1e3:.1f} ms; ratio {each / whole:.1f}x "
          f"(load avg {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
