"""``get(key, out=...)`` of the keyed library store (store.kv) with an ``out`` that cannot
take the value: one typed error, one message, on every tier, sealed or not; the value and
``out`` are left as they were."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import numpy as np
import pytest

from security.memory_keys import memory_keyring
from store.kv import BadOutBuffer, KVStore, KVStoreConfig, Sealing
from store.types import Tier

VALUE = bytes(range(256)) * 4  # 1 KiB


def read_only() -> np.ndarray:
    out = np.zeros(2048, np.uint8)
    out.setflags(write=False)
    return out


BAD = {  # name: (a fresh out, what the message says)
    "too small": (lambda: np.zeros(len(VALUE) - 1, np.uint8),
                  f"out is too small ({len(VALUE) - 1} B, the value has {len(VALUE)} B)"),
    "too small by dtype": (lambda: np.zeros(255, np.float32),
                           f"out is too small (1020 B, the value has {len(VALUE)} B)"),
    "objects": (lambda: np.zeros(2048, object), "out is an array of Python objects"),
    "bytes": (lambda: bytes(2048), "out is read-only"),
    "read-only array": (read_only, "out is read-only"),
    "strided": (lambda: np.zeros(4096, np.uint8)[::2], "out is not C-contiguous"),
    "fortran": (lambda: np.zeros((64, 64), np.uint8, order="F"), "out is not C-contiguous"),
    "not a buffer": (lambda: [0] * 2048, "out is a list, not a buffer"),
}
SHAPE = ": get needs a writable, C-contiguous buffer of plain elements with room for the value"


@pytest.fixture(params=["plain", "sealed"])
def store(request, tmp_path: Path):
    sealing = None
    if request.param == "sealed":
        sealing = Sealing(keyring=memory_keyring("acme"), tenant="acme")
    config = KVStoreConfig(name=f"akv-kv-out-{uuid.uuid4().hex[:10]}", slot_bytes=64 << 10,
                           host_slots=2, nvme_dir=str(tmp_path / "nv"))
    with KVStore(config, sealing) as opened:
        opened.put(b"host", VALUE, Tier.HOST)
        opened.put(b"nvme", VALUE, Tier.NVME)
        yield opened


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_out_is_one_typed_error_with_one_message_on_every_tier(store, case):
    make, says = BAD[case]
    messages = []
    for key in (b"host", b"nvme"):  # used to be ValueError, TypeError, BufferError,
        out = make()                # InvalidRecord (a ShardError) or silently no bytes
        before = copy.deepcopy(out)
        with pytest.raises(BadOutBuffer) as bad:
            store.get(key, out=out)
        messages.append(str(bad.value))
        assert np.array_equal(np.asarray(out), np.asarray(before))  # nothing written into it
        assert store.get(key) == VALUE  # the value stays
    assert messages[0] == messages[1] == says + SHAPE
    assert isinstance(bad.value, ValueError)


@pytest.mark.parametrize("key", [b"host", b"nvme"])
def test_any_writable_contiguous_out_with_room_takes_the_value(store, key):
    for out in (np.zeros(len(VALUE), np.uint8), np.zeros(300, np.float32),
                np.zeros((2, 1024), np.uint8), bytearray(4096), memoryview(bytearray(5000))):
        view = store.get(key, out=out)
        assert bytes(view) == VALUE and len(view) == len(VALUE)
        assert bytes(memoryview(out).cast("B")[:len(VALUE)]) == VALUE  # in out itself
    dates = np.zeros(128, "datetime64[D]")  # exports no buffer: was numpy's ValueError
    assert bytes(store.get(key, out=dates)) == VALUE
    assert dates.view(np.uint8).tobytes()[:len(VALUE)] == VALUE
