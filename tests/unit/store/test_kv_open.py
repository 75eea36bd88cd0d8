"""Opening the keyed library store (store.kv) over an NVMe directory that is not its own to
prune: written with sealing set the other way, mixed, or holding another tenant's records.
The open fails with a typed error naming what it found, and the directory keeps every
byte; a store opened the right way afterwards reads every value."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.chunked import MAGIC, VERSION
from security.memory_keys import memory_keyring
from store.host_pool import SHM_DIR
from store.kv import ForeignTenant, KVStore, KVStoreConfig, Sealing, SealingMismatch
from store.kv_sealing import RecordKind, open_plan
from store.nvme import NvmeShard
from store.types import Tier

SLOT = 1 << 20
# plain keys of every length class, one of them as long as a sealed record's key
PLAIN = {b"a": b"one", b"k" * 32: b"thirty-two byte key", b"z" * 255: bytes(70_000),
         b"empty": b""}


def open_store(directory: Path, ring=None, *, tenant: str = "acme", name: str | None = None,
               host_slots: int = 2) -> KVStore:
    sealing = None if ring is None else Sealing(keyring=ring, tenant=tenant)
    config = KVStoreConfig(name=name or f"akv-kv-open-{uuid.uuid4().hex[:10]}", slot_bytes=SLOT,
                           host_slots=host_slots, nvme_dir=str(directory))
    return KVStore(config, sealing)


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def write_plain(directory: Path) -> None:
    with open_store(directory) as store:
        for key, value in PLAIN.items():
            store.put(key, value, Tier.NVME)


def write_sealed(directory: Path, ring) -> None:
    with open_store(directory, ring) as store:
        store.put(b"s1", b"sealed one", Tier.NVME)
        store.put(b"s2", bytes(range(256)) * 300, Tier.NVME)


def test_a_sealed_store_refuses_a_directory_of_unsealed_records_and_changes_nothing(tmp_path):
    directory = tmp_path / "nv"
    write_plain(directory)
    before = snapshot(directory)
    name = f"akv-kv-open-{uuid.uuid4().hex[:10]}"
    with pytest.raises(SealingMismatch) as refused:  # used to tombstone every record
        open_store(directory, memory_keyring("acme"), name=name)
    assert refused.value.plain_records == len(PLAIN) and refused.value.sealed_records == 0
    assert refused.value.sealed_store and "4 unsealed and 0 sealed" in str(refused.value)
    assert "sealing=None" in str(refused.value)
    assert snapshot(directory) == before and not (Path(SHM_DIR) / name).exists()
    with open_store(directory) as store:
        assert {key: store.get(key) for key in PLAIN} == PLAIN


def test_an_unsealed_store_refuses_a_directory_of_sealed_records_and_changes_nothing(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    write_sealed(directory, ring)
    before = snapshot(directory)
    with pytest.raises(SealingMismatch) as refused:
        open_store(directory)
    assert refused.value.sealed_records == 2 and refused.value.plain_records == 0
    assert not refused.value.sealed_store and "0 unsealed and 2 sealed" in str(refused.value)
    assert snapshot(directory) == before
    with open_store(directory, ring) as store:
        assert store.get(b"s1") == b"sealed one"
        assert store.get(b"s2") == bytes(range(256)) * 300


def test_a_mixed_directory_is_refused_both_ways(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    write_sealed(directory, ring)
    with NvmeShard(directory) as shard:  # a plain record next to the sealed ones
        shard.put(b"plain", b"written without sealing", 0)
    before = snapshot(directory)
    for opener in (lambda: open_store(directory, ring), lambda: open_store(directory)):
        with pytest.raises(SealingMismatch) as refused:
            opener()
        assert (refused.value.plain_records, refused.value.sealed_records) == (1, 2)
        assert snapshot(directory) == before


def test_a_store_opened_under_another_tenant_retires_not_even_dead_records(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme", "other")
    with open_store(directory, ring) as store:
        store.put(b"old", b"under generation 1", Tier.NVME)  # first in the shard's index
        ring.rotate("acme")
        store.put(b"new", b"under generation 2", Tier.NVME)
    ring.destroy_generation("acme", 1)  # "old" no longer opens: an acme store drops it
    before = snapshot(directory)
    with pytest.raises(ForeignTenant):  # used to retire "old" before it found "new"
        open_store(directory, ring, tenant="other")
    assert snapshot(directory) == before
    with open_store(directory, ring) as store:
        assert len(store.nvme) == 1 and store.get(b"new") == b"under generation 2"


def test_records_that_look_sealed_only_by_chance_stay_plain(tmp_path):
    directory = tmp_path / "nv"
    lookalike = MAGIC + bytes((VERSION, 0, 0, 0)) + bytes(200)  # no own key at 32..64
    with open_store(directory) as store:
        store.put(b"q" * 32, lookalike, Tier.NVME)
    with open_store(directory) as store:  # an unsealed store opens it again
        assert store.get(b"q" * 32) == lookalike


@pytest.mark.parametrize(("kinds", "sealed", "expected"), [
    ({b"a": RecordKind.PLAIN, b"b": RecordKind.PLAIN}, False, []),
    ({b"a": RecordKind.OURS, b"b": RecordKind.DEAD}, True, [b"b"]),
    ({}, True, []),
    ({b"a": RecordKind.PLAIN, b"b": RecordKind.DEAD}, True, SealingMismatch),
    ({b"a": RecordKind.SEALED, b"b": RecordKind.PLAIN}, False, SealingMismatch),
    ({b"a": RecordKind.FOREIGN, b"b": RecordKind.DEAD}, True, ForeignTenant),
    ({b"a": RecordKind.FOREIGN, b"b": RecordKind.PLAIN}, True, SealingMismatch),
])
def test_open_plan(kinds, sealed, expected):
    if isinstance(expected, list):
        assert open_plan("d", kinds, sealed) == expected
    else:
        with pytest.raises(expected):
            open_plan("d", kinds, sealed)


def test_values_survive_a_crash_and_reopen_with_the_same_setting(tmp_path):
    root = Path(__file__).resolve().parents[3]
    directory = tmp_path / "nv"
    crash = (f"import os\nfrom store.kv import KVStore, KVStoreConfig\nfrom store.types import Tier\n"
             f"s = KVStore(KVStoreConfig(name='akv-kv-open-{uuid.uuid4().hex[:10]}', "
             f"slot_bytes={SLOT}, host_slots=1, nvme_dir={str(directory)!r}))\n"
             f"s.put(b'n', b'on nvme', Tier.NVME)\ns.put(b'h', b'on host')\n"
             f"os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", crash], cwd=root, check=False, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True)
    assert done.returncode == -9, done.stderr
    with open_store(directory, host_slots=1) as store:
        assert store.get(b"n") == b"on nvme"  # the host index was the process's
        assert not store.contains(b"h")
        out = np.zeros(16, np.uint8)
        assert bytes(store.get(b"n", out=out)) == b"on nvme"


def test_a_sealed_store_with_smaller_slots_keeps_and_reads_larger_records(tmp_path):
    directory, ring = tmp_path / "nv", memory_keyring("acme")
    big = bytes(range(256)) * 4096  # 1 MiB
    with open_store(directory, ring) as store:
        store.put(b"big", big, Tier.NVME)
        store.put(b"small", b"s", Tier.NVME)
    config = KVStoreConfig(name=f"akv-kv-open-{uuid.uuid4().hex[:10]}", slot_bytes=4096,
                           host_slots=1, nvme_dir=str(directory))
    with KVStore(config, Sealing(keyring=ring, tenant="acme")) as store:
        assert len(store.nvme) == 2  # used to retire "big" as a record that does not open
        assert store.get(b"big") == big and store.get(b"small") == b"s"
    with open_store(directory, ring) as store:
        assert store.get(b"big") == big
