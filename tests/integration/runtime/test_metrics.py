"""Scrape ``/metrics`` and ``/readyz`` of a running service: the figures that live in the
actors (credit waits, per-tier occupancy, pool-tier bytes, recompute tokens) reach the
exposition, and readiness follows the directory (a real redis-server going away)."""

from __future__ import annotations

import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.directory_glue import RedisSpec
from agentkv_cluster.runtime.directory_watch import probe
from agentkv_cluster.runtime.service import Service
from store.types import Codec
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.redis_proc import RedisProcess

pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 2 x L x H x 128 tokens x D fp16 = 128 KiB


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-metrics-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "metrics": {"port": 0},
        "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir, hbm_capacity=3 * PAGE).start(local=True,
                                                                       metrics_http=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _get(svc: Service, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.http.port}{path}", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(svc: Service) -> dict[tuple[str, tuple], float]:
    code, text = _get(svc, "/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_readiness_follows_the_directory(service) -> None:
    ready = (200, "ready\ncontroller ok\ndirectory ok\n")
    assert _get(service, "/readyz") == ready
    redis = RedisProcess().start()
    spec = RedisSpec(url=redis.url)
    embedded = service.topo.directory
    try:
        assert probe(spec) == (True, "directory ok")
        service.topo.directory = spec  # as `agentkv serve --redis-url` deploys it
        assert _get(service, "/readyz") == ready
        redis.close()
        code, body = _get(service, "/readyz")
        head, controller, directory = body.splitlines()
        assert (code, head, controller) == (503, "not ready: directory", "controller ok")
        assert directory.startswith("directory unreachable: DirectoryUnavailable")
    finally:
        service.topo.directory = embedded
        redis.close()
    assert _get(service, "/readyz")[0] == 200


def test_credit_waits_occupancy_and_pool_bytes_are_exported(service) -> None:
    before = scrape(service)
    with service.client("acme") as client:
        s = client.open_session("m1")
        pages = [kv_page(i, "evidence", identity("acme", "m1", 1000 * i)) for i in range(6)]
        keys = s.store_pages(pages)  # 6 pages into room for 3: the oldest go to the pool
        prep = s.prepare_load(keys[:2])
        done = s.complete_load(prep["load_id"])
        assert [p["data"] for p in done["pages"]] == [p["data"] for p in pages[:2]]
        assert {p["source"] for p in prep["pages"]} & {"host", "nvme"}
        s.release(keys[:2])
    after = scrape(service)
    waits = ("agentkv_credit_wait_seconds_count", (("tier", "hbm"),))
    assert after[waits] - before.get(waits, 0) >= 2  # one per restore at least
    loads = ("agentkv_load_phase_seconds_count", (("phase", "transfer"),))
    assert after[loads] - before.get(loads, 0) == 1  # the one prepare_load, its phases
    spent = ("agentkv_load_phase_seconds_sum", (("phase", "transfer"),))
    assert after[spent] - before.get(spent, 0) > 0  # it restored two pages
    occ = "agentkv_tier_occupancy_bytes"
    assert after[(occ, (("tier", "hbm"),))] >= PAGE
    assert after[(occ, (("tier", "host"),))] + after[(occ, (("tier", "nvme"),))] >= PAGE
    pool_bytes = sum(v for (n, labels), v in after.items()
                     if n == "agentkv_transfer_bytes_total"
                     and ("tenant", service.metrics.tenant("acme")) in labels
                     and dict(labels)["tier"] in ("host", "nvme"))
    assert pool_bytes >= PAGE
    # Each copy the demotions wrote to a pool tier, by the codec the policy chose for it.
    copies = {dict(labels)["codec"]: v - before.get((n, labels), 0)
              for (n, labels), v in after.items() if n == "agentkv_pages_compressed_total"
              and ("tenant", service.metrics.tenant("acme")) in labels}
    assert sum(copies.values()) >= 3 and set(copies) <= {c.name.lower() for c in Codec}


def test_prefetches_that_gave_room_are_counted(service) -> None:
    executor = service.topo.controller.target.executor  # local mode: the actor itself
    before = scrape(service).get(("agentkv_prefetch_gave_room_total", ()), 0)
    executor.gave_room += 2  # what Executor.room_wanted counts when a prefetch gives way
    after = scrape(service)[("agentkv_prefetch_gave_room_total", ())]
    assert after - before == 2


def test_recompute_tokens_count_pages_lost_for_good(service) -> None:
    topo = service.topo
    with service.client("acme") as client:
        s = client.open_session("r1")
        (key,) = s.store_pages([kv_page(0, "temp_reasoning", identity("acme", "r1", 0))])
        before = scrape(service)
        # The HBM actor dies with the only copy (it comes back empty).
        topo.controller.remove_hbm("node0-hbm0")
        topo.hbms["node0-hbm0"].reset()
        topo.controller.add_hbm("node0-hbm0", topo.hbms["node0-hbm0"], 3 * PAGE, "node0")
        with pytest.raises(RemoteError, match="PageLost"):
            s.prepare_load([key])
    after = scrape(service)
    series = ("agentkv_recompute_tokens_total", (("tenant", service.metrics.tenant("acme")),))
    assert after[series] - before.get(series, 0) == 128


def test_prefix_lookup_hits_and_misses_in_pages_and_tokens(service) -> None:
    label = service.metrics.tenant("acme")
    before = scrape(service)
    with service.client("acme") as client:
        s = client.open_session("lk")
        ids = [identity("acme", "lk", 128 * i) for i in range(4)]
        s.store_pages([kv_page(i, "evidence", ids[i]) for i in range(2)])
        # Two held, then one never stored (the run stops there), then one more.
        found = s.lookup_prefix([i.pack() for i in ids[:2]]
                                + [identity("acme", "lk", 9000, tokens=64).pack(), ids[3].pack()])
        assert found["length"] == 2
    after = scrape(service)

    def delta(name: str, result: str) -> float:
        key = (name, (("result", result), ("tenant", label)))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("agentkv_prefix_lookup_pages_total", "hit") == 2
    assert delta("agentkv_prefix_lookup_pages_total", "miss") == 2
    assert delta("agentkv_prefix_lookup_tokens_total", "hit") == 256
    assert delta("agentkv_prefix_lookup_tokens_total", "miss") == 64 + 128


def test_request_latency_build_info_process_and_hidden_counters(service) -> None:
    with service.client("acme") as client:
        s = client.open_session("lat")
        keys = s.store_pages([kv_page(0, "evidence", identity("acme", "lat", 0))])
        s.load(keys)
        s.release(keys)
    got = scrape(service)
    names = {n for n, _ in got}
    for op in ("store_pages", "prepare_load", "complete_load", "release"):
        count = got[("agentkv_request_duration_seconds_count", (("op", op),))]
        assert count >= 1 and got[("agentkv_request_duration_seconds_sum", (("op", op),))] > 0
    build = [labels for n, labels in got if n == "agentkv_build_info"]
    assert len(build) == 1 and dict(build[0])["version"] not in ("", "unknown")
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= names
    label = service.metrics.tenant("acme")
    total = got[("agentkv_restore_seconds_total", (("tenant", label),))]
    hidden = got[("agentkv_restore_hidden_seconds_total", (("tenant", label),))]
    assert total > 0 and 0 <= hidden <= total
    # The running gauge is the same ratio the two counters give.
    assert got[("agentkv_hidden_fraction", (("tenant", label),))] == pytest.approx(hidden / total)


def test_an_erased_tenant_leaves_metrics_and_the_erasure_is_counted(service) -> None:
    with service.client("gone") as client:
        s = client.open_session("e1")
        keys = s.store_pages([kv_page(0, "evidence", identity("gone", "e1", 0))])
        s.load(keys)
        s.release(keys)
    label = service.metrics.tenant("gone")
    before = scrape(service)
    assert any(("tenant", label) in labels for _, labels in before)
    receipt = service.erase_tenant("gone")
    after = scrape(service)
    assert [k for k in after if ("tenant", label) in k[1]] == []
    ok = ("agentkv_erasures_total", (("result", "ok" if not receipt.failed_tiers else "failed"),))
    assert after[ok] - before.get(ok, 0) == 1
