"""A ``store_pages`` whose HBM actor dies while it runs, on a real Ray cluster (one
machine, three emulated GPU nodes).

The store used to answer with every key even when the HBM actor that took its first
chunk died before the second landed elsewhere: those pages had no copy left and answered
``PageLost`` (as ``bad_args``) at their first load. Now the front checks, once every chunk
landed, that they landed in one actor (the controller's ``store`` names it), and stores
the call again onto the actor the session moved to (the pages that died are ingested
again from the bytes the front still holds; those that lived are kept as they are). An
actor that dies after the last chunk landed loses its pages like any later failure, and
they answer ``page_lost`` at their next load.

One module-scoped cluster and service; each test kills one HBM actor.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import PageLostError, RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.front import STAGE_PAGES
from agentkv_cluster.runtime.service import Service
from tests.integration.runtime.test_actor_faults import page as fault_page
from tests.integration.runtime.test_actor_faults import wait_until
from tests.support.ray_cluster import NODE, ray_cluster

pytest.importorskip("ray")

pytestmark = pytest.mark.integration

L, H, D, TOKENS = 2, 2, 64, 128
PAGE = 1 << 17  # one page's bytes (2*L*H*TOKENS*D fp16) and one arena page


@pytest.fixture(scope="module")
def service():
    with ray_cluster(NODE, NODE) as cluster:
        workdir = Path(tempfile.mkdtemp(prefix="agentkv-store-death-"))
        cfg = load_config(env={}, overrides={
            "api": {"port": 0}, "ray": {"address": cluster.address},
            "hbm": {"page_bytes": PAGE, "num_pages": 32},
            "pool": {"pool_bytes": 8 << 20, "slot_bytes": PAGE,
                     "nvme_dir": str(workdir / "nv")},
        })
        svc = Service(cfg, workdir=workdir, policy="lru", hbm_capacity=16 * PAGE).start()
        assert len(svc.topo.hbms) == 3
        yield svc
        svc.stop()


def page(pid: int, session: str) -> dict:
    """A page only HBM holds once stored (``temp_reasoning`` is not written through)."""
    return fault_page(pid, session, "temp_reasoning")


def kill_after_chunk(service, monkeypatch, hbm: str, chunk: int, *, forgotten: bool) -> None:
    """Kill ``hbm`` as soon as the store's ``chunk``-th chunk (1 first) landed in it, before
    the front goes on; ``forgotten``: wait until the controller forgot it (its sessions
    moved), as the watcher does within a second."""
    controller = service.front.controller
    store = controller.store
    sent: list = []

    def store_then_kill(tenant, session, metas, spans, after=None):
        took = store(tenant, session, metas, spans, after)
        sent.append(len(metas))
        if len(sent) == chunk:
            service.topo.hbms[hbm].kill()
            if forgotten:
                wait_until(lambda: hbm not in controller.topology()["hbms"],
                           "the controller to forget the dead HBM actor")
        return took

    monkeypatch.setattr(controller, "store", store_then_kill)


def load_all(s, keys: list[bytes]) -> list[bytes]:
    prep = s.prepare_load(keys)
    got = [pg["data"] for pg in s.complete_load(prep["load_id"])["pages"]]
    s.release(keys)
    return got


def test_pages_of_a_chunk_whose_hbm_actor_died_mid_store_are_stored_again(
        service, monkeypatch) -> None:
    """The session moved to another HBM actor between two chunks of one store: the first
    chunk's pages died with the first actor, and the reply still named them."""
    with service.client("acme") as client:
        s = client.open_session("mid")
        hbm = s.opened["hbm"]
        pages = [page(i, "mid") for i in range(2 * STAGE_PAGES)]  # two chunks
        kill_after_chunk(service, monkeypatch, hbm, 1, forgotten=True)
        keys = s.store_pages(pages)
        monkeypatch.undo()
        assert load_all(s, keys) == [p["data"] for p in pages]  # was PageLost
        assert service.front.controller.hbm_of("acme", "mid") != hbm
        s.close()


def test_pages_whose_hbm_actor_dies_after_the_reply_answer_page_lost(
        service, monkeypatch) -> None:
    """Every byte landed in one actor, then it died before the front sent the reply: that
    is a loss like any later one (store_survival: a check would cost a round trip on every
    store). Its pages say so at their next load: ``page_lost``, typed, never bad_args."""
    with service.client("acme") as client:
        s = client.open_session("late")
        hbm = s.opened["hbm"]
        pages = [page(100 + i, "late") for i in range(2)]  # one chunk
        kill_after_chunk(service, monkeypatch, hbm, 1, forgotten=False)
        keys = s.store_pages(pages)
        monkeypatch.undo()
        controller = service.front.controller
        wait_until(lambda: hbm not in controller.topology()["hbms"],
                   "the controller to forget the dead HBM actor")
        with pytest.raises(PageLostError) as info:  # was bad_args
            s.prepare_load(keys)
        assert info.value.code == "page_lost" and isinstance(info.value, RemoteError)
        s.close()
