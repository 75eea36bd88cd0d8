"""Tenant erasure on a running service (Ray, a real redis-server, host pool, NVMe shard).

One tenant has a load mid-restore and another session paused in a tool call when it is
erased. Afterwards a token for the same name reads nothing of it, no byte of its pages
nor its name is left in /dev/shm, the NVMe shard, the Ray temp directory or the HBM
arenas, and the receipt verifies offline with every tier done.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis as redis_py

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.erasure import TIERS
from agentkv_cluster.runtime.service import Service
from security.blinding import DirectoryBlinder
from security.erasure import verify_receipt
from security.keyring import FileKeySource, TenantKeyring
from security.signing import load_verifier
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.ray_cluster import NODE, ray_cluster
from tests.support.redis_proc import RedisProcess

pytest.importorskip("ray")
pytestmark = pytest.mark.integration

PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 128 KiB
TENANT = "erasable-qx7"  # a name that appears nowhere else
N = 16  # pages per session


@pytest.fixture(scope="module")
def redis():
    server = RedisProcess().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(head=NODE) as c:
        yield c


@pytest.fixture(scope="module")
def service(cluster, redis):
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-erase-live-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "ray": {"address": cluster.address},
        "directory": {"redis_url": redis.url},
        "hbm": {"page_bytes": PAGE, "num_pages": 24},
        # 8 host slots: the rest of the demoted pages spill to the NVMe shard
        "pool": {"pool_bytes": 8 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")},
        "credits": {"per_link": 1, "per_session": 1},
    })
    svc = Service(cfg, workdir=workdir, policy="agentkv", hbm_capacity=6 * PAGE).start()
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _pages(session: str, first: int) -> list[dict]:
    return [kv_page(first + i, "evidence", identity(TENANT, session, 1000 * (first + i)))
            for i in range(N)]


def _needles(pages: list[dict]) -> list[bytes]:
    """64 bytes from the start, middle and end of every page (random fp16: unique, as long
    as no other page was drawn from the same seed; the test checks that of the other
    tenant's page)."""
    out = []
    for p in pages:
        d = p["data"]
        out += [d[:64], d[len(d) // 2:len(d) // 2 + 64], d[-64:]]
    return out


def _scan_files(root: Path, needles: list[bytes], since: float) -> list[str]:
    """Files under ``root`` changed since ``since`` that hold any needle (read in 8 MiB
    chunks with an overlap, so a needle across a chunk boundary is found)."""
    hits = []
    overlap = max(len(n) for n in needles)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                st = path.stat()
                if not path.is_file() or st.st_mtime < since or st.st_size > (2 << 30):
                    continue
                with open(path, "rb") as f:
                    tail = b""
                    while chunk := f.read(8 << 20):
                        window = tail + chunk
                        if any(n in window for n in needles):
                            hits.append(str(path))
                            break
                        tail = window[-overlap:]
            except OSError:
                continue  # another process's file, or gone meanwhile
    return hits


def test_erasure_of_a_busy_tenant_on_the_live_service(service, cluster, redis) -> None:
    t0 = time.time() - 1
    owner = service.client(TENANT)
    busy = owner.open_session("a")  # its task is restoring when the erasure comes
    a_pages = _pages("a", 0)
    a_keys = busy.store_pages(a_pages)
    busy.event("task_start", event_id=1, task_id="t", version=1, ts=1.0,
               prefix_generation=1, input_pages=list(range(N)))
    paused = owner.open_session("b")  # paused in a tool call
    b_pages = _pages("b", 100)
    b_keys = paused.store_pages(b_pages)
    paused.event("task_start", event_id=1, task_id="t", version=1, ts=1.0,
                 prefix_generation=1, input_pages=list(range(100, 100 + N)))
    paused.event("tool_start", event_id=2, task_id="t", version=2, ts=2.0, call_id="c1",
                 tool="pytest")
    with service.client("globex") as other:  # another tenant, untouched by the erasure
        g = other.open_session("g")
        # Its own random bytes: kv_page seeds its generator from the page id and token
        # start, so globex's page 0 at token 0 would equal the erased tenant's first page,
        # and the arena scan below would find it in globex's live page.
        g_page = kv_page(0, "evidence", identity("globex", "g", 7))
        g_key = g.store_pages([g_page])[0]
        stats = [p.stats() for p in service.topo.pools.values()]
        assert sum(st["host_used_bytes"] for st in stats) > 0, stats
        assert sum(st["nvme_live_bytes"] for st in stats) > 0, stats

        needles = _needles(a_pages + b_pages)
        name = [TENANT.encode()]
        assert not any(n in g_page["data"] for n in needles + name)  # the scans' premise
        held = [any(h.arena_holds(needles)) for h in service.topo.hbms.values()]
        assert any(held)  # the scan of the arenas sees resident pages before the erasure
        control = service.workdir / "nv" / "control.bin"  # and the file scan sees a needle
        control.write_bytes(b"x" * 100 + needles[0])
        assert _scan_files(service.workdir / "nv", needles, t0) == [str(control)]
        control.unlink()

        # the service made the tenant a confined Redis user when it first appeared
        keyring = TenantKeyring(FileKeySource(service.keys_dir))
        user = f"akv-{DirectoryBlinder(keyring).namespace(TENANT)}"
        admin = redis_py.Redis.from_url(redis.url)
        deadline = time.monotonic() + 30
        while admin.acl_getuser(user) is None:
            assert time.monotonic() < deadline, "no Redis user was made for the tenant"
            time.sleep(0.1)
        before = service.stats()["controller"]["restores"]
        outcome: dict[str, object] = {}

        def load() -> None:  # most of the pages are in the host pool or on NVMe
            try:
                outcome["load_id"] = busy.prepare_load(a_keys[:6])["load_id"]
            except RemoteError as exc:
                outcome["error"] = exc.code

        loader = threading.Thread(target=load)
        loader.start()
        deadline = time.monotonic() + 30
        while service.stats()["controller"]["restores"] == before:
            assert time.monotonic() < deadline and loader.is_alive(), "no restore started"
            time.sleep(0.002)
        receipt = service.erase_tenant(TENANT)  # restores of that load are in flight
        loader.join(60)
        assert not loader.is_alive()
        if "load_id" in outcome:  # a fast box: the load was prepared before the erasure came
            print("\nthe load was prepared before the erasure; its completion must be refused")
            with pytest.raises(RemoteError) as refused:
                busy.complete_load(outcome["load_id"])
            assert refused.value.code in {"tenant_erased", "unauthenticated"}, refused.value
        else:
            assert outcome == {"error": "tenant_erased"}, outcome

        counts = dict(receipt.counts)
        print(f"\nreceipt counts: {counts}")
        assert receipt.failed_tiers == () and all(c >= 0 for c in counts.values())
        assert set(counts) == {*TIERS, "directory"}
        assert counts["controller"] == 2 * N and counts["sessions"] == 2
        assert counts["host"] + counts["nvme"] > 0  # HBM may hold none of them by now
        assert counts["redis-user"] == 1 and admin.acl_getuser(user) is None
        admin.close()
        public = load_verifier(service.workdir / "audit.pub")
        assert verify_receipt(receipt.to_json(), public).tenant == TENANT

        # The old token is void; a new token for the same name starts an empty tenant.
        with pytest.raises(RemoteError, match="unauthenticated"):
            paused.release(b_keys)
        owner.close()
        with service.client(TENANT) as fresh:
            s = fresh.open_session("a")  # the same session name as before
            ids = [identity(TENANT, "a", 1000 * i).pack() for i in range(N)]
            assert s.lookup_prefix(ids)["length"] == 0
            with pytest.raises(RemoteError, match="not_found"):
                s.prepare_load(a_keys[:1])
            s.event("task_start", event_id=1, task_id="t", version=1, ts=1.0,
                    prefix_generation=1)
        assert service.stats()["pages"] == 1  # globex's page only

        # No byte of the erased pages, nor the tenant's name, anywhere.
        for hbm in service.topo.hbms.values():
            assert not any(hbm.arena_holds(needles + name))
        session_dir = Path(cluster.head_node.get_session_dir_path())
        for root in (Path("/dev/shm"), service.workdir / "nv", session_dir):
            assert _scan_files(root, needles + name, t0) == [], root

        done = g.complete_load(g.prepare_load([g_key])["load_id"])  # globex still reads
        assert done["pages"][0]["data"] == g_page["data"]
