"""``complete_load`` hands back every page's exact bytes, with the HBM pushes of a load
batched: one call per ``STAGE_PAGES`` pages, all in flight together. The load's pins are
held until the engine releases them, so a page-by-page ``complete_load`` kept other
loads waiting for room (seen next to a CPU hog: its median time halved when batched)."""

from __future__ import annotations

import math

import pytest

from agentkv_cluster.runtime.front import STAGE_PAGES
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

PAGE = 1 << 17  # kv_page's geometry: 2 layers, 2 heads, 128 tokens, 64 dims, fp16


@pytest.fixture(scope="module")
def service():
    with local_service("agentkv-complete-", page_bytes=PAGE, hbm_pages=16,
                       pool_bytes=32 * PAGE) as svc:
        yield svc


def _count_serves(service, monkeypatch) -> list[int]:
    """Pages per ``HbmActor.serve`` call, for every HBM actor (local mode: plain objects)."""
    calls: list[int] = []
    for handle in service.front.hbms.values():
        actor = handle.target
        real = actor.serve

        def serve(keys, dsts, real=real):
            calls.append(len(keys))
            return real(keys, dsts)

        monkeypatch.setattr(actor, "serve", serve)
    return calls


@pytest.mark.parametrize("n", [1, STAGE_PAGES, 2 * STAGE_PAGES + 3])
def test_complete_load_serves_every_page_exactly_in_batches(service, monkeypatch, n) -> None:
    with service.client("acme") as client:
        s = client.open_session(f"batched-{n}")
        pages = [kv_page(i, "evidence", identity("acme", f"batched-{n}", 1000 * i))
                 for i in range(n)]
        keys = s.store_pages(pages)
        calls = _count_serves(service, monkeypatch)
        prepared = s.prepare_load(keys)
        done = s.complete_load(prepared["load_id"])["pages"]
        s.release(keys)
    assert [p["key"] for p in done] == keys
    for page, got in zip(pages, done):
        assert got["exact"] and got["data"] == page["data"]
    assert sum(calls) == n
    assert len(calls) == math.ceil(n / STAGE_PAGES), calls


def test_a_page_gone_from_hbm_fails_the_whole_batch_cleanly(service) -> None:
    """A page dropped between prepare and complete: ``not_found`` for the load, nothing
    half served, and the staging slots all given back (the next load works)."""
    from agentkv_cluster.api.protocol import RemoteError

    with service.client("acme") as client:
        s = client.open_session("gone")
        pages = [kv_page(i, "evidence", identity("acme", "gone", 1000 * i)) for i in range(3)]
        keys = s.store_pages(pages)
        prepared = s.prepare_load(keys)
        free = service.front.mover.scrub_free()  # free staging slots (zeroes them)
        for handle in service.front.hbms.values():
            handle.target.drop(keys[1])
        with pytest.raises(RemoteError) as err:
            s.complete_load(prepared["load_id"])
        assert err.value.code == "not_found"
        assert service.front.mover.scrub_free() == free


def test_a_load_larger_than_one_reply_is_served_in_pages(service, monkeypatch) -> None:
    """``complete_load`` with ``start`` answers what fits one reply frame and ``next``;
    without it a load that does not fit is refused and kept (it used to be answered in one
    frame over the limit, which the client refused, and the load id was spent)."""
    from agentkv_cluster.api.protocol import RemoteError
    from agentkv_cluster.config import FRAME_ENVELOPE_BYTES
    from agentkv_cluster.runtime.front import REPLY_PER_PAGE

    monkeypatch.setattr(service.front, "max_reply_bytes",
                        FRAME_ENVELOPE_BYTES + 3 * (PAGE + REPLY_PER_PAGE))  # three a reply
    with service.client("acme") as client:
        s = client.open_session("paged")
        pages = [kv_page(i, "evidence", identity("acme", "paged", 1000 * i)) for i in range(8)]
        keys = s.store_pages(pages)
        load_id = s.prepare_load(keys)["load_id"]
        with pytest.raises(RemoteError) as err:
            s._call("complete_load", load_id=load_id)
        assert err.value.code == "bad_args" and "start=0" in err.value.message
        replies = []
        start = 0
        while start is not None:
            reply = s._call("complete_load", load_id=load_id, start=start)
            replies.append(len(reply["pages"]))
            start = reply["next"]
        assert replies == [3, 3, 2]
        with pytest.raises(RemoteError) as err:  # served whole: the load is gone
            s._call("complete_load", load_id=load_id, start=0)
        assert err.value.code == "not_found"
        done = s.complete_load(s.prepare_load(keys)["load_id"])["pages"]  # the client pages
        s.release(keys)
    assert [p["key"] for p in done] == keys
    assert all(got["exact"] and got["data"] == page["data"] for page, got in zip(pages, done))


def test_loads_never_completed_do_not_accumulate(service) -> None:
    """A prepared load goes when the engine releases its pages (or after ``LOAD_TTL_S``;
    unit-tested in tests/unit/service/test_prepared_loads.py), so a client that prepares
    and releases without completing cannot grow the front."""
    from agentkv_cluster.api.protocol import RemoteError

    before = len(service.front.loads)
    with service.client("acme") as client:
        s = client.open_session("never-completed")
        keys = s.store_pages([kv_page(i, "evidence", identity("acme", "never-completed", i))
                              for i in range(2)])
        for _ in range(50):
            load_id = s.prepare_load(keys)["load_id"]
            s.release(keys)
        assert len(service.front.loads) == before
        with pytest.raises(RemoteError) as err:
            s.complete_load(load_id)
        assert err.value.code == "not_found"


def test_an_identity_stored_again_keeps_its_page_and_refuses_another_size(service) -> None:
    from agentkv_cluster.api.protocol import RemoteError

    with service.client("acme") as client:
        s = client.open_session("again")
        page = kv_page(0, "evidence", identity("acme", "again", 0))
        key = s.store_pages([page])[0]
        assert s.store_pages([page]) == [key]  # the same page again: one copy
        shorter = {**page, "data": page["data"][:1000], "shape": None}
        with pytest.raises(RemoteError) as err:
            s.store_pages([shorter])
        assert err.value.code == "bad_args" and "stored with" in err.value.message
        other = kv_page(1, "evidence", identity("acme", "again", 1000))
        twice = {**other, "data": other["data"][:1000], "shape": None}
        with pytest.raises(RemoteError):  # one identity twice in one call, two sizes
            s.store_pages([other, twice])
        assert s.load([key])[0] == page["data"]
        with pytest.raises(RemoteError) as err:
            client.open_session("again").prepare_load([b"k" * 32])
        assert err.value.code == "not_found" and not err.value.message.startswith(("'", '"'))
