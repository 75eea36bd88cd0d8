"""HostPoolPageStore on a real /dev/shm host pool."""

from __future__ import annotations

import os
import uuid

import pytest

from agentkv_cluster.engines.page_store import (
    HostPoolPageStore,
    PageStoreClosed,
    PageStoreFull,
    PageTooLarge,
)
from store.host_pool import HostPool
from store.types import Lookup

pytestmark = pytest.mark.integration


@pytest.fixture
def store():
    s = HostPoolPageStore.create(f"agentkv-test-ps-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                 8192, 2)
    yield s
    s.close()


def test_put_get_delete_round_trip(store):
    store.put(b"a", b"x" * 5000)
    found, data = store.get(b"a")
    assert found is Lookup.HIT and bytes(data) == b"x" * 5000
    assert b"a" in store and len(store) == 1
    store.delete(b"a")
    assert store.get(b"a") == (Lookup.MISS, None)
    assert store.pool.stats().used_slots == 0


def test_another_process_view_reads_the_same_bytes(store):
    store.put(b"k", b"page-bytes")
    reader = HostPool.attach(store.pool.name)
    try:
        slot = next(iter(reader.slots()))[0]
        assert bytes(reader.read(slot)) == b"page-bytes"
    finally:
        reader.close()


def test_full_pool_and_oversized_pages_fail_cleanly(store):
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    with pytest.raises(PageStoreFull):
        store.put(b"c", b"3")
    store.delete(b"a")
    with pytest.raises(PageTooLarge):
        store.put(b"big", b"z" * 9000)
    assert b"big" not in store
    assert store.pool.stats().used_slots == 1  # the slot taken for the oversized page was freed
    assert bytes(store.get(b"b")[1]) == b"2"


def test_delete_zeroes_the_slot_before_it_is_reused(store):
    secret = bytes(range(1, 256)) * 20  # 5,100 bytes, none of them zero
    store.put(b"k", secret)
    reader = HostPool.attach(store.pool.name)  # another process's view of the segment
    try:
        slot = next(iter(reader.slots()))[0]
        off = reader.slot_offset(slot)
        assert bytes(reader.buffer[off:off + len(secret)]) == secret
        _, view = store.get(b"k")  # the read buffer now holds the page too
        store.delete(b"k")
        assert not reader.buffer[off:off + store.pool.slot_bytes].any()
        assert not any(bytes(view))  # the caller's view of the read buffer is zeroed too
    finally:
        reader.close()


def test_a_closed_store_refuses_every_call_with_a_typed_error(store):
    store.put(b"k", b"page")
    store.close()
    for call in (lambda: store.put(b"j", b"x"), lambda: store.get(b"k"),
                 lambda: store.delete(b"k")):
        with pytest.raises(PageStoreClosed, match="closed"):
            call()
    store.close()  # closing twice is not an error
