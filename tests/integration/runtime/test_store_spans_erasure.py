"""A store of more pages than the front stages at once is several controller calls. Each
call after the first is refused if the session the first stored into was closed, or its
tenant erased, since: the later calls used to be admitted into a session of the same name
opened anew, after the erasure by a new token of the tenant, so pre-erasure bytes were
stored after the erasure receipt was signed, and the re-created tenant loaded them with
the keys the store answered. The pause between two calls is injected (a wrapper around
the front's controller handle); in a service it is a wait for staging slots or a slow
controller call (service in local mode: real NIXL, /dev/shm, files and AES-GCM). A store
still waiting for its first slots when its tenant is erased is refused too."""

from __future__ import annotations

import threading

import pytest

from agentkv_cluster.api.errors import TenantErased
from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.runtime.front import STAGE_PAGES
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.integration.runtime.test_metrics import PAGE
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture
def service():
    with local_service("agentkv-store-spans-", page_bytes=PAGE, hbm_pages=32,
                       pool_bytes=16 * PAGE) as svc:
        yield svc


def _held_after_first_call(service, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The front's second controller store call waits for ``go`` (``paused`` is set)."""
    real = service.front.controller.store
    paused, go = threading.Event(), threading.Event()
    calls: list[str] = []

    def store(tenant, session, metas, spans, after=None):
        calls.append(tenant)
        if len(calls) == 2:
            paused.set()
            assert go.wait(60.0)
        return real(tenant, session, metas, spans, after)

    monkeypatch.setattr(service.front.controller, "store", store)
    return paused, go


def _store_in_background(session, pages) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(session.store_pages(pages))
        except RemoteError as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("how", ["erased", "reopened"])
def test_a_store_whose_session_went_between_its_calls_is_refused(service, monkeypatch, how):
    pages = [kv_page(i, "evidence", identity("acme", "agent-42", 128 * i))
             for i in range(2 * STAGE_PAGES)]
    paused, go = _held_after_first_call(service, monkeypatch)
    thread, out = _store_in_background(service.client("acme").open_session("agent-42"), pages)
    assert paused.wait(60.0)
    if how == "erased":
        receipt = service.erase_tenant("acme")
        assert not receipt.failed_tiers
    else:
        service.client("acme").open_session("agent-42").close()
    fresh = service.client("acme").open_session("agent-42")  # the same name, anew
    go.set()
    thread.join(60.0)
    assert isinstance(out[0], RemoteError), "the store answered keys of a session gone"
    assert out[0].code == ("tenant_erased" if how == "erased" else "not_found"), out[0]
    later = [p["identity"] for p in pages[STAGE_PAGES:]]
    assert fresh.lookup_prefix(later)["length"] == 0  # nothing of it in the new session


def test_an_open_session_during_an_erasure_neither_provisions_nor_ends_the_freeze(service):
    """A request that authenticated just before an erasure began and opens a session
    during it is refused, and the erasure's freeze stays: the front's ``open_session``
    re-read the marks by ending the freeze, so the tenant's next calls went through
    until the mark was written (found by review)."""
    client = service.client("acme")
    client.open_session("before")  # the tenant and its keys exist
    principal = service.front.authenticate(service.token("acme"))
    service.front.erasures.freeze("acme")  # the erasure began; its mark is not written yet
    try:
        with pytest.raises(TenantErased):
            service.front.open_session(principal, "during")
        with pytest.raises(TenantErased):  # still frozen for the tenant's next call
            service.front.authenticate(service.token("acme"))
    finally:
        service.front.erasures.forget("acme")


def test_a_store_erased_while_it_waited_for_slots_is_refused(service, monkeypatch) -> None:
    """The same before its first controller call: it waits for staging slots (injected
    around the front's ``_staged``) while its tenant is erased, the name provisioned again
    and a session of the same name opened by a new token; once it has its slots it is
    refused, and nothing of it lands in the new session."""
    pages = [kv_page(i, "evidence", identity("acme", "agent-7", 128 * i)) for i in range(2)]
    old = service.client("acme").open_session("agent-7")  # authenticated before the erasure
    real, waiting, go = service.front._staged, threading.Event(), threading.Event()

    def staged(n: int):
        if not waiting.is_set():  # the store's first chunk: no slot free for a while
            waiting.set()
            assert go.wait(60.0)
        return real(n)

    monkeypatch.setattr(service.front, "_staged", staged)
    thread, out = _store_in_background(old, pages)
    assert waiting.wait(60.0)
    assert not service.erase_tenant("acme").failed_tiers
    fresh = service.client("acme").open_session("agent-7")  # the name anew, same session
    go.set()
    thread.join(60.0)
    assert isinstance(out[0], RemoteError), "a pre-erasure store landed after the receipt"
    assert out[0].code in ("unauthenticated", "tenant_erased"), out[0]
    assert fresh.lookup_prefix([p["identity"] for p in pages])["length"] == 0
