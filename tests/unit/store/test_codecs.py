"""Codecs: exact sizes, error bounds, round trips through bytes, input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from store.codecs import (
    CodecInputError,
    CodecSpec,
    EncodedFormatError,
    EncodedKV,
    RecomputeRequired,
    decode_kv,
    encode_kv,
    kv_error,
    measure,
)
from store.codecs.quant import pack, unpack
from store.types import Codec

L, H, T, D = 2, 3, 70, 64  # 70 tokens: two whole KIVI groups of 32 plus a 6-token tail


def _kv(dtype=torch.float16, tokens=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(L, H, tokens, D, generator=g)
    k[..., 7] *= 12.0  # an outlier key channel, as real keys have
    v = torch.randn(L, H, tokens, D, generator=g)
    return k.to(dtype), v.to(dtype)


def _exact_size(spec: CodecSpec, dtype: torch.dtype, tokens: int = T) -> int:
    item = torch.empty((), dtype=dtype).element_size()
    n = L * H * tokens * D
    if spec.codec is Codec.FULL:
        return 2 * n * item
    meta_v = L * H * tokens * (D // 32) * 2 * 2  # fp16 scale + min per group
    data = n * spec.bits // 8
    if spec.key_grouping == "token":
        return 2 * data + 2 * meta_v
    main = tokens // 32 * 32
    k_bytes = L * H * main * D * spec.bits // 8 + L * H * (main // 32) * D * 4
    k_bytes += L * H * (tokens - main) * D * item
    return k_bytes + data + meta_v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("spec", "max_err"),
    [
        (CodecSpec.full(), 0.0),
        (CodecSpec.int8(), 0.01),
        (CodecSpec.int4(), 0.10),
        (CodecSpec.int4("token"), 0.12),  # outlier channel hurts per-token keys
        (CodecSpec.int2(), 0.45),
    ],
    ids=["full", "int8", "int4-kivi", "int4-tok", "int2-kivi"],
)
def test_quant_codecs_have_exact_size_and_bounded_error(spec, max_err, dtype):
    k, v = _kv(dtype)
    enc, report = measure(k, v, spec)
    assert enc.nbytes == report.nbytes == _exact_size(spec, dtype)
    assert report.input_nbytes == k.numel() * k.element_size() * 2
    k_hat, v_hat = decode_kv(enc)
    assert k_hat.dtype == dtype and k_hat.shape == k.shape and v_hat.shape == v.shape
    assert report.error.worst <= max_err
    if spec.codec is Codec.FULL:
        assert torch.equal(k_hat, k) and torch.equal(v_hat, v)
    else:
        assert report.error.rel_fro_k > 0.0


def test_int4_kivi_beats_per_token_keys_on_outlier_channels():
    k, v = _kv()
    _, kivi = measure(k, v, CodecSpec.int4())
    _, tok = measure(k, v, CodecSpec.int4("token"))
    assert kivi.error.rel_fro_k < tok.error.rel_fro_k
    assert kivi.error.rel_fro_v == tok.error.rel_fro_v  # values are per token in both


def test_kivi_tail_tokens_stay_exact():
    k, v = _kv()
    k_hat, _ = decode_kv(encode_kv(k, v, CodecSpec.int4()))
    assert torch.equal(k_hat[:, :, 64:], k[:, :, 64:])


def test_int8_round_trip_error_is_within_half_a_step():
    k, v = _kv(torch.float32)
    k_hat, _ = decode_kv(encode_kv(k, v, CodecSpec.int8()))
    groups = k.reshape(L, H, T, 2, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 255
    err = (k_hat - k).abs().reshape(L, H, T, 2, 32).amax(-1)
    assert bool((err <= step * 0.5 + step * 0.01 + 1e-3).all())


@pytest.mark.parametrize("scale", [1e-5, 1e-4, 1e-3, 1e-2, 1e2])
def test_int8_error_is_within_half_a_step_at_any_scale(scale):
    """The fp16 scale had a floor at fp16's smallest normal (2**-14), so every group that
    spans less than 255 * 2**-14 = 0.016 lost levels. INT8 error was then 2.3 % at a span
    of 0.005, against 0.5 %. Nor may rounding a scale to fp16 clip a group's top value.
    Bound: half a step (the scale is rounded up by at most one fp16 step), plus the fp16
    rounding of the group's minimum."""
    k, v = _kv(torch.float32)
    k, v = k * scale, v * scale
    k_hat, _ = decode_kv(encode_kv(k, v, CodecSpec.int8()))
    groups = k.reshape(L, H, T, 2, 32)
    lo = groups.amin(-1)
    step = (groups.amax(-1) - lo) / 255
    lo_round = torch.clamp(lo.abs() * 2.0**-11, min=2.0**-25)
    err = (k_hat - k).abs().reshape(L, H, T, 2, 32).amax(-1)
    assert bool((err <= step * 0.505 + lo_round).all()), float((err / step).max())


def test_constant_groups_decode_exactly():
    k = torch.full((1, 1, 64, 64), 0.5, dtype=torch.float16)
    k_hat, v_hat = decode_kv(encode_kv(k, k.clone(), CodecSpec.int4()))
    assert torch.equal(k_hat, k) and torch.equal(v_hat, k)


def test_low_rank_full_rank_is_near_exact_and_lower_rank_is_smaller():
    k, v = _kv(torch.float32)
    _, full_rank = measure(k, v, CodecSpec.low_rank(D))
    enc8, r8 = measure(k, v, CodecSpec.low_rank(8))
    assert full_rank.error.worst < 1e-5
    assert enc8.nbytes == 2 * L * H * (T * 8 + 8 * D) * 4
    assert 0.0 < r8.error.rel_fro_v < 1.0


def test_low_rank_recovers_a_truly_low_rank_block():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(L, H, T, 4, generator=g), torch.randn(L, H, 4, D, generator=g)
    k = (a @ b).half()
    _, report = measure(k, k.clone(), CodecSpec.low_rank(4))
    assert report.error.worst < 2e-3


@pytest.mark.parametrize(
    "spec",
    [CodecSpec.full(), CodecSpec.int8(), CodecSpec.int4(), CodecSpec.int2(), CodecSpec.low_rank(5)],
    ids=lambda s: s.label,
)
def test_bytes_round_trip_decodes_identically(spec):
    k, v = _kv(torch.bfloat16)
    enc = encode_kv(k, v, spec, identity=b"\x01" * 32)
    wire = enc.to_bytes()
    assert len(wire) == enc.wire_size() and len(wire) - enc.nbytes < 1024
    back = EncodedKV.from_bytes(bytearray(wire))
    assert back.spec == spec and back.identity == b"\x01" * 32 and back.nbytes == enc.nbytes
    for a, b in zip(decode_kv(enc), decode_kv(back)):
        assert torch.equal(a, b)


def test_from_bytes_rejects_damage():
    wire = encode_kv(*_kv(), CodecSpec.int8()).to_bytes()
    with pytest.raises(EncodedFormatError, match="truncated"):
        EncodedKV.from_bytes(wire[: len(wire) - 10])
    with pytest.raises(EncodedFormatError, match="magic"):
        EncodedKV.from_bytes(b"XXXX" + wire[4:])
    with pytest.raises(EncodedFormatError, match="truncated"):
        EncodedKV.from_bytes(wire[:3])


def test_recompute_entry_holds_only_token_ids_and_identity():
    ids = list(range(100, 170))
    enc = encode_kv(None, None, CodecSpec.recompute(), token_ids=ids, identity=b"id" * 16)
    assert enc.nbytes == 70 * 4
    with pytest.raises(RecomputeRequired) as info:
        decode_kv(enc)
    assert info.value.token_ids.tolist() == ids and info.value.identity == b"id" * 16
    k, v = _kv()
    got = decode_kv(
        EncodedKV.from_bytes(enc.to_bytes()), recompute=lambda t: (k[:, :, : len(t)], v)
    )
    assert torch.equal(got[0], k)
    with pytest.raises(CodecInputError, match="token_ids"):
        encode_kv(None, None, CodecSpec.recompute(), identity=b"x")
    with pytest.raises(CodecInputError, match="identity"):
        encode_kv(None, None, CodecSpec.recompute(), token_ids=ids)


def test_encode_leaves_inputs_untouched_and_decode_owns_memory():
    k, v = _kv(torch.float32)
    k0, v0 = k.clone(), v.clone()
    enc = encode_kv(k, v, CodecSpec.full())
    encode_kv(k, v, CodecSpec.int4())
    assert torch.equal(k, k0) and torch.equal(v, v0)
    k_hat, _ = decode_kv(enc)
    k_hat.zero_()
    assert torch.equal(decode_kv(enc)[0], k0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"codec": Codec.INT8, "bits": 4}, "bits=8"),
        ({"codec": Codec.INT4, "bits": 3}, "bits=4 or bits=2"),
        ({"codec": Codec.INT4, "key_grouping": "head"}, "key_grouping"),
        ({"codec": Codec.LOW_RANK}, "rank"),
        ({"codec": Codec.INT4, "group_size": 30}, "group_size"),
    ],
)
def test_bad_specs_are_rejected(kwargs, match):
    with pytest.raises(CodecInputError, match=match):
        CodecSpec(**kwargs)


def test_spec_defaults_and_labels():
    assert CodecSpec(codec=Codec.INT8).key_grouping == "token"
    assert CodecSpec(codec=Codec.INT4).key_grouping == "channel"
    assert CodecSpec(codec=Codec.INT4).bits == 4
    labels = [
        s.label
        for s in (
            CodecSpec.int8(),
            CodecSpec.int4(),
            CodecSpec.int2(),
            CodecSpec.int4("token"),
            CodecSpec.low_rank(16),
            CodecSpec.full(),
        )
    ]
    assert labels == ["int8", "int4-kivi", "int2-kivi", "int4-tok", "lowrank-r16", "full"]


def test_bad_tensors_are_rejected():
    k, v = _kv()
    with pytest.raises(CodecInputError, match="head_dim"):
        encode_kv(k[..., :48], v[..., :48], CodecSpec.int4())
    with pytest.raises(CodecInputError, match=r"\[layers"):
        encode_kv(k[0], v[0], CodecSpec.int8())
    with pytest.raises(CodecInputError, match="differ"):
        encode_kv(k, v.float(), CodecSpec.int8())
    with pytest.raises(CodecInputError, match="dtype"):
        encode_kv(k.to(torch.int32), v.to(torch.int32), CodecSpec.int8())


def test_kv_error_is_relative_frobenius():
    k = torch.ones(1, 1, 4, 4)
    err = kv_error(k, k, k * 1.1, k)
    assert err.rel_fro_k == pytest.approx(0.1) and err.rel_fro_v == 0.0


def test_pack_unpack_round_trip_for_every_width():
    g = torch.Generator().manual_seed(3)
    for bits in (8, 4, 2):
        codes = torch.randint(0, 1 << bits, (5, 32), generator=g, dtype=torch.uint8)
        packed = pack(codes, bits)
        assert packed.shape == (5, 32 * bits // 8)
        assert torch.equal(unpack(packed, bits), codes)


@pytest.mark.gpu
def test_cuda_round_trip_matches_cpu():
    k, v = _kv()
    spec = CodecSpec.int4()
    cpu = decode_kv(encode_kv(k, v, spec))
    gpu = decode_kv(encode_kv(k.cuda(), v.cuda(), spec), device="cpu")
    for a, b in zip(cpu, gpu):
        assert (a.float() - b.float()).abs().max() <= 0.02 * a.float().abs().max()


SPECS = [CodecSpec.int8(), CodecSpec.int4(), CodecSpec.int4("token"), CodecSpec.int2()]


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 2),
    heads=st.integers(1, 3),
    tokens=st.integers(0, 100),
    dim=st.sampled_from([32, 64, 128]),
    spec=st.sampled_from(SPECS + [CodecSpec.low_rank(3), CodecSpec.full()]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
    scale=st.floats(1e-3, 1e3),
)
def test_any_geometry_round_trips_through_bytes(layers, heads, tokens, dim, spec, dtype, scale):
    g = torch.Generator().manual_seed(tokens * 7 + dim)
    k = (torch.randn(layers, heads, tokens, dim, generator=g) * scale).to(dtype)
    v = (torch.randn(layers, heads, tokens, dim, generator=g) * scale).to(dtype)
    enc = encode_kv(k, v, spec)
    back = EncodedKV.from_bytes(enc.to_bytes())
    k1, v1 = decode_kv(enc)
    k2, v2 = decode_kv(back)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert k1.shape == k.shape and v1.dtype == dtype
    if spec.codec in (Codec.INT8, Codec.INT4) and tokens:
        bound = {8: 0.02, 4: 0.2, 2: 0.6}[spec.bits]
        assert kv_error(k, v, k1, v1).worst <= bound


def test_low_rank_rank_above_token_count_is_exact_and_compact():
    k, v = _kv(torch.float32, tokens=5)
    enc, report = measure(k, v, CodecSpec.low_rank(16))
    assert enc.tensors["k.a"].shape == (L, H, 5, 5) and report.error.worst < 1e-5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e6])
def test_values_fp16_metadata_cannot_hold_are_rejected(bad):
    k, v = _kv(torch.float32)
    k[1, 2, 3, 4] = bad
    with pytest.raises(CodecInputError, match="fp16 range"):
        encode_kv(k, v, CodecSpec.int4())


def test_recompute_entry_without_tensors_stands_for_no_input_bytes():
    enc = encode_kv(None, None, CodecSpec.recompute(), token_ids=[1, 2], identity=b"i")
    assert enc.input_nbytes == 0 and enc.k_shape == ()
    k, v = _kv()
    with_kv = encode_kv(k, v, CodecSpec.recompute(), token_ids=[1, 2], identity=b"i")
    assert with_kv.input_nbytes == 2 * k.numel() * 2 and with_kv.nbytes == 8


@pytest.mark.parametrize(
    "spec",
    [CodecSpec.full(), CodecSpec.int8(), CodecSpec.int4(), CodecSpec.low_rank(4)],
    ids=lambda s: s.label,
)
def test_decode_into_preallocated_buffers_matches_fresh_decode(spec):
    k, v = _kv()
    enc = encode_kv(k, v, spec)
    bufs = (torch.full_like(k, 7.0), torch.full_like(v, 7.0))
    got = decode_kv(enc, out=bufs)
    assert got[0] is bufs[0] and got[1] is bufs[1]
    for a, b in zip(decode_kv(enc), bufs):
        assert torch.equal(a, b)


def test_decode_into_wrong_buffers_is_rejected():
    k, v = _kv()
    enc = encode_kv(k, v, CodecSpec.int8())
    with pytest.raises(CodecInputError, match="need a contiguous"):
        decode_kv(enc, out=(k.float(), v.float()))
    with pytest.raises(CodecInputError, match="need a contiguous"):
        decode_kv(enc, out=(k.transpose(2, 3).contiguous().transpose(2, 3), v.clone()))


def test_write_into_a_dirty_buffer_is_byte_identical_to_to_bytes():
    enc = encode_kv(*_kv(), CodecSpec.int4())
    wire = enc.to_bytes()
    dirty = np.full(len(wire) + 100, 0xEE, dtype=np.uint8)
    assert enc.write_into(dirty) == len(wire)
    assert dirty[: len(wire)].tobytes() == wire
    with pytest.raises(CodecInputError, match="holds"):
        enc.write_into(bytearray(10))
