"""One contract for every tier store: HBM arena, host pool (and NVMe shards: see below).

Each backend is wrapped in a tiny adapter with the same five verbs, so every test
here runs unchanged against every backend:

    put(data: bytes) -> ref      store one page, return whatever locates it
    get(ref) -> bytes | Lookup   the exact bytes, or Lookup.MISS once deleted
    delete(ref) -> None
    used_bytes() -> int          page bytes currently held
    close() -> None

plus attributes ``max_page_bytes``, ``capacity_pages`` (pages of max size that
fit) and ``full_error`` (the exception a put raises when nothing more fits).

To add a backend (e.g. NvmeShard): write ``make_<name>(tmp_path) -> adapter``
below and append ``pytest.param(make_<name>, id="<name>")`` to BACKENDS.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from store.hbm import ArenaFull, HbmArena, PageNotAllocated
from store.host_pool import HostPool, PoolFull, SlotEmpty
from store.nvme import DiskFull, NvmeShard, NvmeShardConfig
from store.nvme.format import header_block
from store.slab_pool import SlabClass, SlabPool, SlabRef
from store.types import Lookup

PAGE = 64 * 1024
PAGES = 6


class HbmAdapter:
    full_error = ArenaFull
    max_page_bytes = PAGE
    capacity_pages = PAGES

    def __init__(self) -> None:
        self.arena = HbmArena(PAGE, PAGES)

    def put(self, data: bytes) -> int:
        page = self.arena.alloc()
        try:
            self.arena.write(page, data)
        except Exception:
            self.arena.free(page)
            raise
        return page

    def get(self, ref: int) -> bytes | Lookup:
        try:
            return self.arena.read(ref)
        except PageNotAllocated:
            return Lookup.MISS

    def delete(self, ref: int) -> None:
        self.arena.free(ref)

    def used_bytes(self) -> int:
        return self.arena.stats().used_bytes

    def close(self) -> None:
        pass


class HostPoolAdapter:
    full_error = PoolFull
    max_page_bytes = PAGE
    capacity_pages = PAGES

    def __init__(self) -> None:
        self.pool = HostPool.create(
            f"akv-contract-{os.getpid()}-{uuid.uuid4().hex[:8]}", PAGE, PAGES
        )

    def put(self, data: bytes) -> int:
        slot = self.pool.alloc()
        try:
            self.pool.write(slot, data)
        except Exception:
            self.pool.free(slot)
            raise
        return slot

    def get(self, ref: int) -> bytes | Lookup:
        try:
            return bytes(self.pool.read(ref))
        except SlotEmpty:
            return Lookup.MISS

    def delete(self, ref: int) -> None:
        self.pool.free(ref)

    def used_bytes(self) -> int:
        return self.pool.stats().used_bytes

    def close(self) -> None:
        self.pool.close()
        self.pool.unlink()


class SlabPoolAdapter(HostPoolAdapter):
    """Two size classes; max-size pages fit only the larger one (PAGES slots)."""

    def __init__(self) -> None:
        name = f"akv-contract-slab-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.pool = SlabPool.create(
            name, [SlabClass(slot_bytes=PAGE, num_slots=PAGES), SlabClass(slot_bytes=8192, num_slots=2)]
        )

    def put(self, data: bytes) -> SlabRef:
        ref = self.pool.alloc(len(data))
        try:
            self.pool.write(ref, data)
        except Exception:
            self.pool.free(ref)
            raise
        return ref


class NvmeShardAdapter:
    """One record per segment, so retiring a page and compacting gives its space back."""

    full_error = DiskFull
    max_page_bytes = PAGE
    capacity_pages = PAGES

    def __init__(self, path: Path) -> None:
        record = header_block(1, 4096) + PAGE  # keys here are 1..2 bytes: one header block
        self.shard = NvmeShard(path, NvmeShardConfig(
            segment_bytes=record, max_bytes=record * PAGES, max_record_bytes=PAGE))
        self._next = 0

    def put(self, data: bytes) -> bytes:
        key = self._next.to_bytes(2, "little")
        self.shard.put(key, data, generation=1)
        self._next += 1
        return key

    def get(self, ref: bytes) -> bytes | Lookup:
        return self.shard.get(ref)

    def delete(self, ref: bytes) -> None:
        self.shard.delete(ref)
        self.shard.compact(min_dead_ratio=1.0)

    def used_bytes(self) -> int:
        return sum(self.shard.locate(k)[1].length for k in list(self.shard.keys()))

    def close(self) -> None:
        self.shard.close()


def make_hbm(tmp_path: Path) -> HbmAdapter:
    return HbmAdapter()


def make_host_pool(tmp_path: Path) -> HostPoolAdapter:
    return HostPoolAdapter()


def make_slab_pool(tmp_path: Path) -> SlabPoolAdapter:
    return SlabPoolAdapter()


def make_nvme(tmp_path: Path) -> NvmeShardAdapter:
    return NvmeShardAdapter(tmp_path / "nvme")


BACKENDS = [
    pytest.param(make_hbm, id="hbm"),
    pytest.param(make_host_pool, id="host_pool"),
    pytest.param(make_slab_pool, id="slab_pool"),
    pytest.param(make_nvme, id="nvme"),
]


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    adapter = request.param(tmp_path)
    yield adapter
    adapter.close()


def _page(i: int, n: int) -> bytes:
    return (i.to_bytes(4, "little") + os.urandom(16)) * (n // 20) + bytes(n % 20)


def test_round_trip_exact_bytes_at_several_sizes(store):
    for i, n in enumerate((1, 4095, 4097, store.max_page_bytes)):
        data = _page(i, n)
        ref = store.put(data)
        assert store.get(ref) == data


def test_pages_never_clobber_each_other(store):
    pages = {
        store.put(d): d
        for d in (_page(i, store.max_page_bytes - i) for i in range(store.capacity_pages))
    }
    assert len(pages) == store.capacity_pages
    for ref, data in pages.items():
        assert store.get(ref) == data


def test_full_fails_cleanly_and_delete_makes_room(store):
    big = store.max_page_bytes
    refs = [store.put(_page(i, big)) for i in range(store.capacity_pages)]
    used = store.used_bytes()
    with pytest.raises(store.full_error):
        store.put(_page(99, big))
    assert store.used_bytes() == used
    for i, r in enumerate(refs):
        assert store.get(r)[:4] == i.to_bytes(4, "little")
    store.delete(refs[0])
    ref = store.put(_page(7, big))
    assert store.get(ref)[:4] == (7).to_bytes(4, "little")


def test_deleted_pages_are_misses(store):
    ref = store.put(b"gone soon")
    store.delete(ref)
    assert store.get(ref) is Lookup.MISS


def test_oversized_page_is_rejected_and_changes_nothing(store):
    ref = store.put(b"stays")
    used = store.used_bytes()
    with pytest.raises(ValueError):
        store.put(bytes(store.max_page_bytes + 1))
    assert store.used_bytes() == used and store.get(ref) == b"stays"
    for _ in range(store.capacity_pages - 1):  # the failed put leaked no capacity
        store.put(bytes(store.max_page_bytes))


def test_used_bytes_tracks_puts_and_deletes(store):
    assert store.used_bytes() == 0
    a = store.put(bytes(1000))
    store.put(bytes(24))
    assert store.used_bytes() == 1024
    store.delete(a)
    assert store.used_bytes() == 24
