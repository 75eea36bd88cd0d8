"""Reference copies beside lossy working copies, and verified restores."""

from __future__ import annotations

import pytest
import torch

from store.codecs import (
    CodecInputError,
    CodecSpec,
    ReferenceCopy,
    decode_kv,
    encode_kv,
    verify_restore,
)
from store.codecs.reference import ReferenceCorrupted


def _kv():
    g = torch.Generator().manual_seed(5)
    return torch.randn(2, 3, 64, 64, generator=g).half(), torch.randn(
        2, 3, 64, 64, generator=g
    ).half()


def test_exact_restore_from_reference_passes_bit_equality():
    k, v = _kv()
    ref = ReferenceCopy.capture(k, v)
    assert ref.nbytes == 2 * k.numel() * 2
    k2, v2 = ref.restore()
    check = verify_restore(ref, k2, v2)
    assert check.ok and check.error.worst == 0.0


def test_lossy_restore_passes_only_within_tolerance():
    k, v = _kv()
    ref = ReferenceCopy.capture(k, v)
    k4, v4 = decode_kv(encode_kv(k, v, CodecSpec.int4()))
    assert not verify_restore(ref, k4, v4).ok  # lossy is not bit-exact
    loose = verify_restore(ref, k4, v4, max_rel_error=0.12)
    assert loose.ok and 0.0 < loose.error.worst <= 0.12
    k2, v2 = decode_kv(encode_kv(k, v, CodecSpec.int2()))
    assert not verify_restore(ref, k2, v2, max_rel_error=0.12).ok


def test_reference_survives_serialization_and_detects_corruption():
    k, v = _kv()
    ref = ReferenceCopy.from_bytes(ReferenceCopy.capture(k, v).to_bytes())
    assert torch.equal(ref.restore()[0], k)
    ref.full.tensors["v"].view(-1)[3] += 1.0
    with pytest.raises(ReferenceCorrupted):
        ref.restore()


def test_reference_is_independent_of_the_live_tensor():
    k, v = _kv()
    ref = ReferenceCopy.capture(k, v)
    k.zero_()
    assert not torch.equal(ref.restore()[0], k)


def test_wrong_page_is_an_error_not_a_failed_check():
    k, v = _kv()
    ref = ReferenceCopy.capture(k, v)
    with pytest.raises(CodecInputError, match="reference"):
        verify_restore(ref, k[:, :, :32], v[:, :, :32], max_rel_error=0.5)
