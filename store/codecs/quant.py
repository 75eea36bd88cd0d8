"""Vectorised asymmetric group quantization and bit packing (torch, cpu or cuda).

A group shares one fp16 scale and one fp16 minimum: x ~ q * scale + min with
q in [0, 2**bits - 1]. Packing puts ``per = 8 // bits`` codes in each byte:
each row (everything past axis 0, flattened) is cut into ``per`` equal
contiguous parts and byte j holds element j of part i in bits
[i*bits, (i+1)*bits). Whole-row parts (rather than neighbouring elements)
keep every pack/unpack op on long unit-stride runs.
"""

from __future__ import annotations

import torch

from store.codecs.spec import CodecInputError

_META_DTYPE = torch.float16
# Smallest stored scale, fp16's smallest subnormal: a constant group (max == min) must not
# divide by zero. (It was 2**-14, the smallest normal: every group spanning less than
# 255 * 2**-14 = 0.016 then lost levels, INT8 error 2.3 % instead of 0.5 % at a span of 0.005.)
_MIN_SCALE = 2.0**-24
_CHUNK_ELEMS = 1 << 18  # 1 MiB of fp32 per chunk: stays in L2
# Adding 2**23 to a float in [0, 2**23) rounds it to an integer held in the low
# mantissa bits: the int32 view's low byte is the code, and int32 -> uint8 is
# several times faster than float -> uint8 on CPU.
_MAGIC = float(1 << 23)


def _scale_up(sc: torch.Tensor) -> torch.Tensor:
    """The fp16 scale nearest above ``sc`` (fp32): rounded down, the group's top values
    would be clipped, by up to half an fp16 step of the scale times ``levels`` (in the
    subnormal range, several quantization steps). For positive fp16, the next value up
    is the next integer of its bit pattern, subnormal or not."""
    s16 = sc.to(_META_DTYPE)
    s16.view(torch.int16).add_(s16.float() < sc)
    return s16


def quantize(
    xg: torch.Tensor, dim: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize groups that span axis ``dim`` (>= 1) of ``xg`` and pack the codes.

    Returns packed uint8 codes shaped [rows, row_elems // per] and fp16
    scale/min shaped like ``xg`` with ``dim`` of size 1. Encoding uses the
    fp16-rounded scale and min, so decoding reproduces what the encoder measured.
    Work runs in cache-sized chunks along axis 0 with reused fp32 buffers:
    fresh large temporaries cost more than the arithmetic on these CPUs.
    """
    if not 1 <= dim < xg.dim():
        raise ValueError(f"group axis must be in [1, {xg.dim()}), got {dim}")
    levels, per = (1 << bits) - 1, 8 // bits
    rows = _rows(xg)
    dev = xg.device
    stat_shape = list(xg.shape)
    stat_shape[dim] = 1
    scale = torch.empty(stat_shape, dtype=_META_DTYPE, device=dev)
    mn = torch.empty(stat_shape, dtype=_META_DTYPE, device=dev)
    row = xg[0].numel() if xg.shape[0] else 0
    if row % per:
        raise ValueError(f"rows of {row} codes do not split into {per} parts")
    packed = torch.empty((xg.shape[0], row // per), dtype=torch.uint8, device=dev)
    buf = torch.empty((min(rows, xg.shape[0]), *xg.shape[1:]), dtype=torch.float32, device=dev)
    pbuf = torch.empty((buf.shape[0], row // per), dtype=torch.float32, device=dev)
    for start in range(0, xg.shape[0], rows):  # chunks, not elements
        stop = min(xg.shape[0], start + rows)
        b = buf[: stop - start]
        b.copy_(xg[start:stop])
        lo16 = b.amin(dim, keepdim=True).to(_META_DTYPE)
        lo = lo16.float()
        sc16 = _scale_up((b.amax(dim, keepdim=True) - lo).div_(levels).clamp_(min=_MIN_SCALE))
        scale[start:stop] = sc16
        mn[start:stop] = lo16
        b.sub_(lo).mul_(sc16.float().reciprocal_()).clamp_(0, levels)
        flat = b.view(stop - start, -1)
        if per == 1:
            packed[start:stop].copy_(flat.add_(_MAGIC).view(torch.int32))
            continue
        flat.add_(_MAGIC).sub_(_MAGIC)  # round to integers (ties to even)
        parts = flat.view(stop - start, per, -1)
        p = pbuf[: stop - start]
        p.copy_(parts[:, 0])
        for i in range(1, per):  # 1 or 3 whole-chunk ops, not a loop over elements
            p.add_(parts[:, i], alpha=1 << (bits * i))
        packed[start:stop].copy_(p.add_(_MAGIC).view(torch.int32))
    # fp16 scale/min cannot hold NaN/inf inputs or magnitudes beyond 65504.
    if not (
        torch.isfinite(scale.sum(dtype=torch.float32))
        and torch.isfinite(mn.sum(dtype=torch.float32))
    ):
        raise CodecInputError("input holds NaN/inf or values beyond fp16 range; store it FULL")
    return packed, scale, mn


def dequantize(
    packed: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, bits: int, out: torch.Tensor
) -> torch.Tensor:
    """Inverse of :func:`quantize`, written into ``out`` (shaped like the grouped input)."""
    per = 8 // bits
    rows = _rows(out)
    chunk = (min(rows, out.shape[0]), *out.shape[1:])
    buf = torch.empty(chunk, dtype=torch.float32, device=out.device)
    codes = torch.empty(chunk, dtype=torch.uint8, device=out.device) if per > 1 else None
    for start in range(0, out.shape[0], rows):  # chunks, not elements
        stop = min(out.shape[0], start + rows)
        b = buf[: stop - start]
        if codes is None:
            b.view(stop - start, -1).copy_(packed[start:stop])
        else:
            c = codes[: stop - start]
            _unpack_into(packed[start:stop], bits, c.view(stop - start, -1))
            b.copy_(c)
        # In-place fp32 ops beat a mixed-dtype addcmul several times over on CPU.
        b.mul_(scale[start:stop].float()).add_(mn[start:stop].float())
        out[start:stop].copy_(b)
    return out


def _rows(x: torch.Tensor) -> int:
    return max(1, _CHUNK_ELEMS // max(1, x[0].numel())) if x.shape[0] else 1


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes (< 2**bits) along the last axis, 8 // bits per byte."""
    per = 8 // bits
    if codes.shape[-1] % per:
        raise ValueError(f"last axis {codes.shape[-1]} is not a multiple of {per}")
    parts = codes.unflatten(-1, (per, -1))
    out = parts[..., 0, :].clone()
    for i in range(1, per):
        out.add_(parts[..., i, :], alpha=1 << (bits * i))
    return out


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: uint8 codes with the last axis 8 // bits times longer."""
    per = 8 // bits
    out = torch.empty(
        *packed.shape[:-1], packed.shape[-1] * per, dtype=torch.uint8, device=packed.device
    )
    _unpack_into(packed, bits, out)
    return out


def _unpack_into(packed: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    per = 8 // bits
    parts = out.unflatten(-1, (per, -1))
    if per == 1:
        parts[..., 0, :].copy_(packed)
        return
    mask = (1 << bits) - 1
    torch.bitwise_and(packed, mask, out=parts[..., 0, :])
    for i in range(1, per - 1):
        torch.bitwise_and(packed >> (bits * i), mask, out=parts[..., i, :])
    torch.bitwise_right_shift(packed, bits * (per - 1), out=parts[..., per - 1, :])
