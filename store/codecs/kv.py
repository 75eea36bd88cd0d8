"""encode_kv / decode_kv: KV blocks [layers, kv_heads, tokens, head_dim] in every codec."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from store.codecs.quant import dequantize, quantize
from store.codecs.spec import KV_DTYPES, CodecInputError, CodecSpec, EncodedKV, RecomputeRequired
from store.types import Codec

Recompute = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def encode_kv(
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    spec: CodecSpec,
    *,
    token_ids: torch.Tensor | Sequence[int] | None = None,
    identity: bytes = b"",
) -> EncodedKV:
    """Encode one KV block. Inputs are never modified; outputs own their memory.

    RECOMPUTE keeps only ``token_ids`` and ``identity`` (k and v may be None).
    """
    if spec.codec is Codec.RECOMPUTE:
        return _encode_recompute(k, v, token_ids, identity)
    _check_kv(k, v, spec)
    if spec.codec is Codec.FULL:
        tensors = {"k": _owned(k), "v": _owned(v)}
    elif spec.codec in (Codec.INT8, Codec.INT4):
        tensors = {
            **_quant_encode(k.detach(), spec, "k", spec.key_grouping),
            **_quant_encode(v.detach(), spec, "v", "token"),
        }
    else:
        tensors = {
            **_lowrank_encode(k.detach(), spec.rank, "k"),
            **_lowrank_encode(v.detach(), spec.rank, "v"),
        }
    return EncodedKV(
        spec=spec,
        k_shape=tuple(k.shape),
        v_shape=tuple(v.shape),
        dtype=k.dtype,
        tensors=tensors,
        identity=bytes(identity),
    )


def decode_kv(
    enc: EncodedKV, device: str | torch.device | None = None, *, recompute: Recompute | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode to (k, v) in the original dtype on ``device`` (default: where enc lives).

    A RECOMPUTE entry calls ``recompute(token_ids)`` or raises RecomputeRequired.
    """
    spec = enc.spec
    if spec.codec is Codec.RECOMPUTE:
        token_ids = enc.tensors["token_ids"]
        if recompute is None:
            raise RecomputeRequired(token_ids, enc.identity)
        return recompute(token_ids)
    dev = enc.device if device is None else torch.device(device)
    if spec.codec is Codec.FULL:  # the caller owns the result: always a copy
        return enc.tensors["k"].to(dev, copy=True), enc.tensors["v"].to(dev, copy=True)
    t = {name: x.to(dev) for name, x in enc.tensors.items()}
    if spec.codec in (Codec.INT8, Codec.INT4):
        k = _quant_decode(t, spec, "k", spec.key_grouping, enc.k_shape, enc.dtype)
        v = _quant_decode(t, spec, "v", "token", enc.v_shape, enc.dtype)
        return k, v
    return _lowrank_decode(t, "k", enc.dtype), _lowrank_decode(t, "v", enc.dtype)


def _owned(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in one pass (``.contiguous().clone()`` may copy twice)."""
    return x.detach().clone(memory_format=torch.contiguous_format)


def _check_kv(k: torch.Tensor | None, v: torch.Tensor | None, spec: CodecSpec) -> None:
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise CodecInputError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise CodecInputError(
                f"{name} must be [layers, kv_heads, tokens, head_dim], got {tuple(x.shape)}"
            )
        if x.dtype not in KV_DTYPES.values():
            raise CodecInputError(f"{name} dtype {x.dtype} is not fp16, bf16 or fp32")
    if k.dtype != v.dtype or k.device != v.device:
        raise CodecInputError(f"k and v differ: {k.dtype}/{k.device} vs {v.dtype}/{v.device}")
    if spec.codec in (Codec.INT8, Codec.INT4):
        per = 8 // spec.bits
        for name, x in (("k", k), ("v", v)):
            d = x.shape[-1]
            group = _token_group(d, spec.group_size)
            if d % group or group % per:
                raise CodecInputError(
                    f"{name} head_dim {d} does not split into groups of {spec.group_size} "
                    f"holding a multiple of {per} codes"
                )


def _token_group(head_dim: int, group_size: int) -> int:
    return min(group_size, head_dim)


def _quant_encode(
    x: torch.Tensor, spec: CodecSpec, prefix: str, grouping: str
) -> dict[str, torch.Tensor]:
    layers, heads, tokens, dim = x.shape
    if grouping == "token":
        group = _token_group(dim, spec.group_size)
        q, scale, mn = quantize(
            x.reshape(layers * heads * tokens, dim // group, group), 2, spec.bits
        )
        return {f"{prefix}.q": q, f"{prefix}.scale": scale, f"{prefix}.min": mn}
    # KIVI keys: groups of `group_size` tokens per channel; the tokens past the
    # last whole group stay in full precision (KIVI's residual window).
    group = spec.group_size
    main = tokens // group * group
    xg = x[:, :, :main].reshape(layers * heads, main // group, group, dim)
    q, scale, mn = quantize(xg, 2, spec.bits)
    return {
        f"{prefix}.q": q,
        f"{prefix}.scale": scale,
        f"{prefix}.min": mn,
        f"{prefix}.tail": _owned(x[:, :, main:]),
    }


def _quant_decode(
    t: dict, spec: CodecSpec, prefix: str, grouping: str, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    packed, scale, mn = t[f"{prefix}.q"], t[f"{prefix}.scale"], t[f"{prefix}.min"]
    out = torch.empty(shape, dtype=dtype, device=packed.device)
    codes_shape = (*packed.shape[:-1], packed.shape[-1] * (8 // spec.bits))
    if grouping == "token":
        dequantize(packed, scale, mn, spec.bits, out.view(codes_shape))
        return out
    main = codes_shape[1] * codes_shape[2]
    dequantize(packed, scale, mn, spec.bits, out[:, :, :main].view(codes_shape))
    out[:, :, main:] = t[f"{prefix}.tail"]
    return out


def _lowrank_encode(x: torch.Tensor, rank: int, prefix: str) -> dict[str, torch.Tensor]:
    """Per (layer, head) truncated SVD, X ~ A @ B with A = U_r S_r = X V_r and B = V_r^T.

    V_r comes from the eigenvectors of the small D x D Gram matrix X^T X (eigh in
    fp64): the same subspace as the SVD of the tall T x D matrix, ~3x faster.
    """
    x32 = x.float()
    gram = torch.matmul(x32.transpose(-1, -2), x32).double()
    _, vecs = torch.linalg.eigh(gram)  # ascending eigenvalues
    r = max(1, min(rank, x.shape[-2], x.shape[-1]))  # rank <= min(T, D); -0: would mean all
    v_r = vecs[..., -r:].flip(-1).float()
    a = torch.matmul(x32, v_r).to(x.dtype).contiguous()
    b = v_r.transpose(-1, -2).to(x.dtype).contiguous()
    return {f"{prefix}.a": a, f"{prefix}.b": b}


def _lowrank_decode(t: dict, prefix: str, dtype: torch.dtype) -> torch.Tensor:
    a, b = t[f"{prefix}.a"], t[f"{prefix}.b"]
    return torch.matmul(a.float(), b.float()).to(dtype)


def _encode_recompute(k, v, token_ids, identity: bytes) -> EncodedKV:
    if token_ids is None:
        raise CodecInputError("RECOMPUTE needs token_ids")
    ids = torch.as_tensor(token_ids).detach().to("cpu")
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise CodecInputError(
            f"token_ids must be a 1-D integer sequence, got {ids.dtype} {tuple(ids.shape)}"
        )
    if not identity:
        raise CodecInputError("RECOMPUTE needs the page identity bytes")
    k_shape = tuple(k.shape) if k is not None else ()
    v_shape = tuple(v.shape) if v is not None else ()
    dtype = k.dtype if k is not None else torch.float16
    return EncodedKV(
        spec=CodecSpec.recompute(),
        k_shape=k_shape,
        v_shape=v_shape,
        dtype=dtype,
        tensors={"token_ids": ids.to(torch.int32).contiguous()},
        identity=bytes(identity),
    )
