"""Service benchmark: side-by-side ratios measured in one run (absolute times are noisy here).

1. Restores of 16 MiB pages through the actors (pool opens the sealed copy and pushes it
   into the HBM actor's arena by NIXL) vs raw NIXL pushes of the same bytes between the
   same two actor processes: one at a time (latency; the actor path has two Ray hops, raw
   one) and as a stream with as many in flight as a link's credits allow (throughput).
   Target: actors/raw throughput >= 0.6.
2. Controller event throughput (the pure bookkeeping the controller actor runs per event).
3. The demo's AgentKV vs LRU table (``agentkv demo`` on the same machine).

    python benchmarks/bench_service.py [--reps 15] [--events 20000] [--inflight 4] [--skip-demo]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MIB = 1 << 20


def _timed_in_parallel(jobs: list, inflight: int) -> float:
    """Seconds to run every job with ``inflight`` threads (each takes the next job)."""
    pending = list(jobs)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop()
            job()

    threads = [threading.Thread(target=worker) for _ in range(inflight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def bench_restore(reps: int, pages: int = 4, inflight: int = 4) -> dict[str, float]:
    """16 MiB FULL restores (pool opens the seal, pushes into the HBM arena by NIXL) vs raw
    NIXL pushes of the same bytes between the same two actor processes (``probe_link``):
    one at a time (latency: the actor path has two Ray hops, raw one) and as a stream of
    ``pages`` restores with ``inflight`` at once (throughput)."""
    from agentkv_cluster.config import load_config
    from agentkv_cluster.lifecycle.types import StateType
    from agentkv_cluster.runtime import wiring
    from agentkv_cluster.runtime.landing import LandingPages
    from agentkv_cluster.runtime.mover import Mover
    from agentkv_cluster.runtime.ray_start import start_ray
    from agentkv_cluster.runtime.records import PageMeta
    from agentkv_cluster.runtime.tenants import ensure_tenant
    from store.types import Codec, Tier

    workdir = Path(tempfile.mkdtemp(prefix="agentkv-bench-"))
    page = 16 * MIB
    cfg = load_config(env={}, overrides={
        "hbm": {"page_bytes": page, "num_pages": pages + 1},
        "pool": {"pool_bytes": (pages + 2) * page, "slot_bytes": page + MIB,
                 "nvme_dir": str(workdir / "nv")},
        "ray": {"num_cpus": 2}, "security": {"tenant_keys_dir": str(workdir / "keys")}})
    start_ray(cfg)
    topo = wiring.deploy(cfg, workdir)
    hbm, pool = topo.hbms["node0-hbm0"], topo.pools["node0"]
    ensure_tenant(str(workdir / "keys"), "bench")
    front = Mover("bench-front", page, 1)
    wiring.introduce(hbm, front)
    slot = front.take_slot()
    front.slot_view(slot)[:] = np.frombuffer(np.random.default_rng(0).bytes(page), np.uint8)
    metas = [PageMeta(key=bytes([65 + i]) * 32, digest=bytes([97 + i]) * 32, tenant="bench",
                      namespace="bench", session="s", page_id=i,
                      state_type=StateType.EVIDENCE, length=page, tokens=1)
             for i in range(pages)]
    for meta in metas:
        hbm.ingest(meta.key, front.slot_span(slot, page))
        receipt = hbm.demote(meta, [(int(Tier.HOST), int(Codec.FULL))], pool, True)
        assert receipt.copies == ((int(Tier.HOST), int(Codec.FULL)),), receipt  # not NVMe

    hbm.add_pool("node0", pool)  # as the controller's executor does: moves name the pool
    refills = ThreadPoolExecutor(1)
    landing = LandingPages("bench", cfg.hbm.landing_pages, background=refills.submit)

    def restore(meta: PageMeta) -> None:  # open the seal, NIXL push into the arena page
        landing.restore("node0-hbm0", hbm, pool, "node0", meta, int(Tier.HOST),
                        int(Codec.FULL))

    def two_hop(meta: PageMeta) -> None:  # through the HBM actor (compressed copies go so)
        hbm.restore(meta, int(Tier.HOST), int(Codec.FULL), "node0")

    actors, hops, raw, s_actors, s_raw = [], [], [], [], []
    for rep in range(reps + 1):  # round 0 warms every path (threads, UCX lanes) untimed
        t0 = time.perf_counter()
        two_hop(metas[0])
        hops.append(time.perf_counter() - t0)
        hbm.drop(metas[0].key)
        t0 = time.perf_counter()
        restore(metas[0])
        actors.append(time.perf_counter() - t0)
        span = hbm.span(metas[0].key)
        t0 = time.perf_counter()
        pool.probe_link(span)  # same bytes, same two processes; one hop, no sealing
        raw.append(time.perf_counter() - t0)
        hbm.drop(metas[0].key)
        s_actors.append(_timed_in_parallel([lambda m=m: restore(m) for m in metas], inflight))
        spans = [hbm.span(m.key) for m in metas]
        s_raw.append(_timed_in_parallel([lambda sp=sp: pool.probe_link(sp) for sp in spans],
                                        inflight))
        for m in metas:
            hbm.drop(m.key)
        if rep == 0:
            for figures in (actors, hops, raw, s_actors, s_raw):
                figures.clear()
            landing.one_hop = landing.two_hop = 0
    landing.release()
    refills.shutdown()
    wiring.shutdown(topo)
    front.close()
    shutil.rmtree(workdir, ignore_errors=True)
    a, r, h = statistics.median(actors), statistics.median(raw), statistics.median(hops)
    sa, sr = statistics.median(s_actors), statistics.median(s_raw)
    return {"actors_gbps": page / a / 1e9, "raw_gbps": page / r / 1e9, "ratio": r / a,
            "two_hop_gbps": page / h / 1e9, "two_hop_ratio": r / h,
            "one_hop": landing.one_hop, "fallbacks": landing.two_hop,
            "stream_actors_gbps": pages * page / sa / 1e9,
            "stream_raw_gbps": pages * page / sr / 1e9, "stream_ratio": sr / sa,
            "pages": pages, "inflight": inflight}


def bench_controller(events: int) -> dict[str, float]:
    from agentkv_cluster.lifecycle.types import StateType
    from agentkv_cluster.runtime.controller import Controller
    from agentkv_cluster.runtime.records import PageMeta
    from agentkv_cluster.runtime.strategies import make_strategy

    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 1 << 40)
    n, now, t0 = 0, 0.0, time.perf_counter()
    session = 0
    while n < events:
        s = f"s{session}"
        ctl.table.open_session("t", s)
        metas = [PageMeta(key=f"{s}-{i}".encode(), digest=b"d" * 32, tenant="t", namespace="t",
                          session=s, page_id=i, state_type=StateType.EVIDENCE, length=1 << 20,
                          tokens=256) for i in range(4)]
        admitted, _ = ctl.admit("t", s, metas, now)
        ctl.ingested([g for g, _ in admitted])
        for v, data in enumerate([
            {"kind": "task_start", "prefix_generation": 1, "prefix_pages": [0],
             "input_pages": [1]},
            {"kind": "model_call", "call_id": "m", "consumes": [0, 1],
             "produces": [[2, "evidence"], [3, "temp_reasoning"]]},
            {"kind": "tool_start", "call_id": "k", "tool": "grep"},
            {"kind": "observation_return", "call_id": "k"},
            {"kind": "task_end"}], start=1):
            now += 0.01
            event = ctl.events.translate("t", s, {**data, "event_id": v, "task_id": "x",
                                                  "version": v, "ts": now})
            ctl.apply(event, now)
            n += 1
        session += 1
    dt = time.perf_counter() - t0
    return {"events": n, "events_per_s": n / dt}


def main() -> None:
    from agentkv_cluster.config import CreditConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--inflight", type=int, default=CreditConfig().per_link,
                    help="restores in flight for the throughput figure (default: the "
                         "service's per-link credit limit)")
    ap.add_argument("--skip-demo", action="store_true")
    args = ap.parse_args()
    ctl = bench_controller(args.events)
    print(f"controller: {ctl['events']} events, {ctl['events_per_s']:.0f} events/s "
          "(pure bookkeeping: event graph + AgentKV gap planning per event)")
    rs = bench_restore(args.reps, inflight=args.inflight)
    print(f"16 MiB restore, one at a time: actors {rs['actors_gbps']:.2f} GB/s vs raw NIXL "
          f"{rs['raw_gbps']:.2f} GB/s -> ratio {rs['ratio']:.2f} (one Ray hop each; through "
          f"the HBM actor, two hops: {rs['two_hop_gbps']:.2f} GB/s, ratio "
          f"{rs['two_hop_ratio']:.2f})")
    print(f"  restores into landing pages: {rs['one_hop']}, fell back to two hops: "
          f"{rs['fallbacks']}")
    verdict = "meets" if rs["stream_ratio"] >= 0.6 else "MISSES"
    print(f"16 MiB restore throughput, {rs['pages']} pages, {rs['inflight']} in flight: actors "
          f"{rs['stream_actors_gbps']:.2f} GB/s vs raw NIXL {rs['stream_raw_gbps']:.2f} GB/s "
          f"-> ratio {rs['stream_ratio']:.2f} ({verdict} the 0.6 target)")
    if not args.skip_demo:
        import ray

        from agentkv_cluster.api.workload import WorkloadSpec
        from agentkv_cluster.cli.demo import _table, run_demo

        ray.shutdown()
        payload = run_demo(WorkloadSpec(sessions=args.sessions), 0.35)
        from rich.console import Console

        Console().print(_table(payload["policies"]))
        a, b = payload["policies"]["agentkv"], payload["policies"]["lru"]
        print(f"AgentKV/LRU: P95 {a['p95_ms'] / max(b['p95_ms'], 1e-9):.2f}x, bytes moved "
              f"{a['transfer_mb_per_batch'] / max(b['transfer_mb_per_batch'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
