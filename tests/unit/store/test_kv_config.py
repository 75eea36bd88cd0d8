"""A store whose ``slot_bytes`` would make NVMe records over ``nvme.max_record_bytes`` is
refused when it is built (``BadConfig``, a ``KVError`` and ``ValueError``): puts it
accepted used to fail on NVMe with the shard's ``InvalidRecord``, sealed ones even when
``slot_bytes`` equalled the limit (a sealed record is larger than its value)."""

from __future__ import annotations

import uuid

import pytest

from security.chunked import record_size
from security.memory_keys import memory_keyring
from store.kv import BadConfig, KVError, KVStore, KVStoreConfig, Sealing
from store.nvme import NvmeShardConfig
from store.types import Tier

SLOT = 64 << 10


def config(tmp_path, limit: int, slot: int = SLOT) -> KVStoreConfig:
    return KVStoreConfig(name=f"akv-kv-config-{uuid.uuid4().hex[:10]}", slot_bytes=slot,
                         host_slots=0, nvme_dir=str(tmp_path / "nv"),
                         nvme=NvmeShardConfig(max_record_bytes=limit))


def test_an_unsealed_slot_over_the_record_limit_is_refused(tmp_path):
    with pytest.raises(BadConfig) as refused:
        config(tmp_path, SLOT - 1)
    assert isinstance(refused.value, KVError) and isinstance(refused.value, ValueError)
    with KVStore(config(tmp_path, SLOT)) as store:  # exactly the limit: every value fits
        assert store.put(b"k", bytes(SLOT)) is Tier.NVME


def test_a_sealed_slot_whose_record_passes_the_limit_is_refused_before_anything_is_made(
        tmp_path):
    sealing = Sealing(keyring=memory_keyring("acme"), tenant="acme")
    with pytest.raises(BadConfig):
        KVStore(config(tmp_path, SLOT), sealing)
    assert not (tmp_path / "nv").exists()
    with KVStore(config(tmp_path, record_size(SLOT)), sealing) as store:
        assert store.put(b"k", bytes(SLOT)) is Tier.NVME
        with store.reserve(b"r", SLOT, Tier.NVME) as r:
            r.buffer[:] = 1
        assert store.get(b"r") == bytes([1]) * SLOT


def test_a_store_without_nvme_has_no_record_limit(tmp_path):
    KVStoreConfig(name="x", slot_bytes=SLOT, host_slots=1,
                  nvme=NvmeShardConfig(max_record_bytes=1))


@pytest.mark.parametrize("sealing", ["a", object(), {"tenant": "acme"}])
def test_a_sealing_of_the_wrong_type_is_a_type_error_naming_it(tmp_path, sealing):
    with pytest.raises(TypeError, match="sealing must be a store.kv_sealing.Sealing"):
        KVStore(config(tmp_path, 2 * SLOT), sealing)
    assert not (tmp_path / "nv").exists()  # refused before anything was made


def test_a_config_of_the_wrong_type_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="must be a store.kv.KVStoreConfig, not dict"):
        KVStore({"name": "x", "slot_bytes": SLOT})  # type: ignore[arg-type]


@pytest.mark.parametrize("keyring, tenant", [("ring", "acme"), (None, "acme"),
                                             (memory_keyring("acme"), ""),
                                             (memory_keyring("acme"), b"acme")])
def test_a_sealing_needs_a_keyring_and_a_tenant_name(keyring, tenant):
    with pytest.raises(TypeError, match="Sealing.(keyring|tenant)"):
        Sealing(keyring=keyring, tenant=tenant)
