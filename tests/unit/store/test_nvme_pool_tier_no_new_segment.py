"""A pool whose NVMe shard cannot create its next segment file (a file system out of
inodes) treats the tier as full, as for any ``DiskFull``: a store spills to a free host
slot or is refused with ``NvmeTierFull`` naming what ran out, and an old NVMe copy is
still retired (its tombstone goes to the active segment). Before, the shard's bare
``OSError`` went through ``TierWriter`` untouched: the store failed without a spill."""

from __future__ import annotations

import errno
import os
import secrets
import threading
from collections.abc import Iterator

import pytest

from agentkv_cluster.runtime.pool_records import StoredCopy
from agentkv_cluster.runtime.pool_tiers import NvmeTierFull, TierWriter
from store.host_pool import HostPool
from store.nvme import NvmeShard, NvmeShardConfig
from store.types import Lookup, Tier

RECORD = 8192  # a header block and a payload of up to one block
PAYLOAD = b"p" * 4000


@pytest.fixture
def host() -> Iterator[HostPool]:
    pool = HostPool.create(f"akv-test-{secrets.token_hex(4)}", 4096, 1)
    try:
        yield pool
    finally:
        pool.close()
        pool.unlink()


@pytest.fixture
def full_shard(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NvmeShard]:
    """A shard whose active segment is full, on a file system that from then on refuses
    new segment files (ENOSPC)."""
    shard = NvmeShard(tmp_path, NvmeShardConfig(segment_bytes=RECORD))
    shard.put(b"old", PAYLOAD, 1)
    real = os.open

    def refusing(path, flags, mode=0o777, *args, **kw):  # type: ignore[no-untyped-def]
        if str(path).endswith(".akv") and flags & os.O_CREAT and not os.path.exists(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, flags, mode, *args, **kw)

    monkeypatch.setattr(os, "open", refusing)
    with shard:
        yield shard


def _copy(nkey: bytes = b"") -> StoredCopy:
    return StoredCopy(tier=Tier.NVME, slot=-1, loc=1, seal_gen=1, dir_gen=1, nbytes=4000,
                      namespace="acme", nkey=nkey)


def test_a_store_spills_to_the_host_then_is_refused_naming_the_file(full_shard, host):
    shard = full_shard
    tiers = TierWriter(host, shard, threading.RLock(), "node0")
    wrote: list[str] = []
    first = _copy(b"a")
    tiers.write(Tier.NVME, first, lambda: wrote.append("host"),
                lambda: shard.put(b"a", PAYLOAD, 1))
    assert (first.tier, first.slot, wrote) == (Tier.HOST, 0, ["host"])
    with pytest.raises(NvmeTierFull, match="cannot create segment file .*seg-00000001"):
        tiers.write(Tier.NVME, _copy(b"b"), lambda: wrote.append("host"),
                    lambda: shard.put(b"b", PAYLOAD, 1))
    assert (tiers.counts.nvme_full, tiers.counts.refused_full) == (2, 1)
    assert shard.keys() == [b"old"] and shard.get(b"old") == PAYLOAD


def test_an_old_nvme_copy_is_still_retired(full_shard, host):
    tiers = TierWriter(host, full_shard, threading.RLock(), "node0")
    new = _copy()
    new.tier, new.slot = Tier.HOST, host.alloc()
    assert tiers.replaced(_copy(b"old"), new) is True  # its tombstone found room
    assert full_shard.get(b"old") is Lookup.MISS and tiers.counts.nvme_full == 0
    assert host.stats().used_slots == 1  # the new copy stays
