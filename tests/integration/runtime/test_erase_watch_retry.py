"""An erasure made by another process (``agentkv tenant erase`` on the key directory) that a
pool did not finish purging on the running service is tried again (found by review: the
watcher marked the tenant enforced at once, so a pool that missed its deadline kept the
tenant's copies and the cached keys that open them while the service ran, and the name
was served again). Local mode: the service in this process, with real NIXL, shared memory,
files and AES-GCM; one extra pool that misses its first purge."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.cli import main
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime import erasure
from agentkv_cluster.runtime.erasure_receipts import PoolPurged
from agentkv_cluster.runtime.handles import ActorSlow, PoolHandle
from agentkv_cluster.runtime.service import Service

pytestmark = pytest.mark.integration
PAGE = 2 * 2 * 2 * 128 * 64 * 2


class _SlowOnce:
    """A pool that misses its first purge's deadline (busy), then answers."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int | None]] = []

    def purge_tenant(self, tenant: str, generation: int | None = None) -> PoolPurged:
        self.asked.append((tenant, generation))
        if len(self.asked) == 1:
            raise ActorSlow("slow-pool: no answer in 300.0 s")
        return PoolPurged(copies=(), host=0, nvme=0, host_free_zeroed=0, nvme_dead_zeroed=0,
                          staging_zeroed=0)

    def tenants_held(self) -> list[str]:
        return []


def _enforced_records(log: Path) -> list[list[str]]:
    return [r["data"]["failed_tiers"] for r in map(json.loads, log.read_text().splitlines())
            if r["kind"] == "erasure.enforced"]


@pytest.fixture()
def slow_pool(monkeypatch):
    """A local service whose tenant acme opened a session, with one extra pool that misses
    its first purge; retries after 0.5 s. Yields (service, that pool, workdir)."""
    monkeypatch.setattr(erasure, "RETRY_S", (0.5, 1.0))
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-erase-retry-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0}, "hbm": {"page_bytes": PAGE, "num_pages": 8},
        "pool": {"pool_bytes": 4 * PAGE, "slot_bytes": PAGE, "nvme_dir": str(workdir / "nv")}})
    svc = Service(cfg, workdir=workdir, hbm_capacity=3 * PAGE).start(local=True)
    slow = _SlowOnce()
    try:
        with svc.client("acme") as client:
            client.open_session("s")
        svc.topo.pools["slow"] = PoolHandle.local(slow, "slow")
        yield svc, slow, workdir
    finally:
        svc.topo.pools.pop("slow", None)
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_purge_a_pool_did_not_finish_is_tried_again(slow_pool) -> None:
    svc, slow, workdir = slow_pool
    log = workdir / "audit.log"
    assert main(["tenant", "erase", "acme", "--keys-dir", svc.keys_dir, "--audit-log",
                 str(log), "--signing-key", str(workdir / "audit.key")]) == 0
    deadline = time.monotonic() + 20.0
    while not _enforced_records(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    first = _enforced_records(log)
    assert first and "host" in first[0], first  # the failed try is on the record
    if len(slow.asked) == 1:  # between the tries: the name is not served again yet
        assert svc.erasure.enforced.get("acme") is None
    while svc.erasure.enforced.get("acme") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(slow.asked) == 2 and svc.erasure.enforced.get("acme") is not None
    assert _enforced_records(log)[-1] == []  # the try that finished, recorded


def test_an_erasure_in_the_service_a_pool_did_not_finish_is_tried_again(slow_pool) -> None:
    """The same for ``Service.erase_tenant`` (found by review: its receipt named the failed
    tier, but the name was served again at once and nothing purged the pool later)."""
    svc, slow, workdir = slow_pool
    receipt = svc.erase_tenant("acme")
    assert "host" in receipt.failed_tiers
    if len(slow.asked) == 1:  # before the watcher's next try: the name is refused
        assert svc.erasure.enforced.get("acme") is None
        with pytest.raises(RemoteError) as info, svc.client("acme") as client:
            client.open_session("s2")
        assert info.value.code == "tenant_erased"
    deadline = time.monotonic() + 20.0
    while svc.erasure.enforced.get("acme") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(slow.asked) == 2 and svc.erasure.enforced.get("acme") is not None
    assert _enforced_records(workdir / "audit.log")[-1] == []  # the try that finished
    with svc.client("acme") as client:  # the name is served again, empty
        client.open_session("s3")


def test_a_purge_is_on_the_record_before_the_name_is_served_again(slow_pool,
                                                                   monkeypatch) -> None:
    """The ``erasure.enforced`` record is written before the name is served again (it was
    written after, so a client could be served before the record existed), and a record
    the audit log refuses leaves the purge unfinished: tried again, name refused."""
    svc, slow, workdir = slow_pool
    log, erasure_ = workdir / "audit.log", svc.erasure
    append, refused = erasure_.audit.append, []

    def refuse_the_first(kind, data, at):
        if kind == "erasure.enforced" and not refused:
            refused.append(data["failed_tiers"])
            raise OSError(28, "No space left on device")
        return append(kind, data, at)

    on_record: list[int] = []
    enforced = erasure_._enforced
    monkeypatch.setattr(erasure_.audit, "append", refuse_the_first)
    monkeypatch.setattr(erasure_, "_enforced", lambda tenant, at: (
        on_record.append(len(_enforced_records(log))), enforced(tenant, at)))
    assert main(["tenant", "erase", "acme", "--keys-dir", svc.keys_dir, "--audit-log",
                 str(log), "--signing-key", str(workdir / "audit.key")]) == 0
    deadline = time.monotonic() + 20.0
    while svc.erasure.enforced.get("acme") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert refused and "host" in refused[0]  # the first try: the pool missed, log refused
    assert len(slow.asked) == 2 and svc.erasure.enforced.get("acme") is not None
    assert _enforced_records(log) == [[]] and on_record == [1]  # recorded, then served
