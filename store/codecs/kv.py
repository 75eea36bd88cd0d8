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
    enc: EncodedKV,
    device: str | torch.device | None = None,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    recompute: Recompute | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode to (k, v) in the original dtype on ``device`` (default: where enc lives).

    ``out=(k_buf, v_buf)`` decodes into preallocated contiguous tensors (their device
    wins); reusing buffers skips first-touch page faults on fresh memory, which cost
    more than the decode itself on CPU. A RECOMPUTE entry calls
    ``recompute(token_ids)`` or raises RecomputeRequired.
    """
    spec = enc.spec
    if spec.codec is Codec.RECOMPUTE:
        token_ids = enc.tensors["token_ids"]
        if recompute is None:
            raise RecomputeRequired(token_ids, enc.identity)
        return recompute(token_ids)
    if out is None:
        dev = enc.device if device is None else torch.device(device)
        k_out = torch.empty(enc.k_shape, dtype=enc.dtype, device=dev)
        v_out = torch.empty(enc.v_shape, dtype=enc.dtype, device=dev)
    else:
        k_out, v_out = out
        _check_out(enc, k_out, v_out)
    if spec.codec is Codec.FULL:
        k_out.copy_(enc.tensors["k"])
        v_out.copy_(enc.tensors["v"])
        return k_out, v_out
    t = {name: x.to(k_out.device) for name, x in enc.tensors.items()}
    if spec.codec in (Codec.INT8, Codec.INT4):
        _quant_decode(t, spec, "k", spec.key_grouping, k_out)
        _quant_decode(t, spec, "v", "token", v_out)
    else:
        k_out.copy_(torch.matmul(t["k.a"].float(), t["k.b"].float()))
        v_out.copy_(torch.matmul(t["v.a"].float(), t["v.b"].float()))
    return k_out, v_out


def _check_out(enc: EncodedKV, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
    for name, buf, shape in (("k", k_out, enc.k_shape), ("v", v_out, enc.v_shape)):
        if tuple(buf.shape) != shape or buf.dtype != enc.dtype or not buf.is_contiguous():
            raise CodecInputError(
                f"out {name} is {buf.dtype} {tuple(buf.shape)} (contiguous={buf.is_contiguous()}), "
                f"need a contiguous {enc.dtype} {shape}"
            )
    if k_out.device != v_out.device:
        raise CodecInputError(f"out tensors on different devices: {k_out.device}, {v_out.device}")


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


def _grouped(x: torch.Tensor, spec: CodecSpec, grouping: str) -> tuple[torch.Tensor, int]:
    """A view of x's quantized part as [layers*heads, ...] and the axis a group spans.

    "token": groups along head_dim. "channel" (KIVI keys): groups of group_size
    tokens per channel, over the whole groups only (the caller keeps the tail).
    """
    layers, heads, tokens, dim = x.shape
    if grouping == "token":
        group = _token_group(dim, spec.group_size)
        return x.reshape(layers * heads, tokens, dim // group, group), 3
    group = spec.group_size
    main = tokens // group * group
    return x[:, :, :main].reshape(layers * heads, main // group, group, dim), 2


def _quant_encode(
    x: torch.Tensor, spec: CodecSpec, prefix: str, grouping: str
) -> dict[str, torch.Tensor]:
    xg, dim = _grouped(x, spec, grouping)
    q, scale, mn = quantize(xg, dim, spec.bits)
    tensors = {f"{prefix}.q": q, f"{prefix}.scale": scale, f"{prefix}.min": mn}
    if grouping == "channel":  # KIVI's residual window: tokens past the last whole group
        tensors[f"{prefix}.tail"] = _owned(x[:, :, xg.shape[1] * xg.shape[2] :])
    return tensors


def _quant_decode(t: dict, spec: CodecSpec, prefix: str, grouping: str, out: torch.Tensor) -> None:
    view, _ = _grouped(out, spec, grouping)
    dequantize(t[f"{prefix}.q"], t[f"{prefix}.scale"], t[f"{prefix}.min"], spec.bits, view)
    if grouping == "channel":
        out[:, :, view.shape[1] * view.shape[2] :] = t[f"{prefix}.tail"]


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
