"""Codec specs, the encoded form of a KV block, its wire form, and error metrics."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack
import numpy as np
import torch

from store.types import KV_DTYPE_NAMES, Codec

# store.types.KV_DTYPE_NAMES, as torch dtypes
KV_DTYPES: Mapping[str, torch.dtype] = {name: getattr(torch, name) for name in KV_DTYPE_NAMES}
_TENSOR_DTYPES: Mapping[str, torch.dtype] = {
    **KV_DTYPES,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
_WIRE_MAGIC = b"AKVC"
_WIRE_VERSION = 1
_WIRE_HEAD = struct.Struct("<4sHI")  # magic, version, meta length
_ALIGN = 64  # each tensor starts on a cache line, so views stay aligned


class CodecError(Exception):
    """Base class for codec failures."""


class CodecInputError(CodecError, ValueError):
    """The tensors or the spec given to a codec are invalid."""


class EncodedFormatError(CodecError, ValueError):
    """Serialized encoded KV bytes are malformed."""


class RecomputeRequired(CodecError):
    """A RECOMPUTE entry holds no KV bytes: re-prefill ``token_ids``."""

    def __init__(self, token_ids: torch.Tensor, identity: bytes) -> None:
        super().__init__(f"recompute entry: re-prefill {token_ids.numel()} tokens")
        self.token_ids = token_ids
        self.identity = identity


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, kw_only=True)
class CodecSpec:
    """What form to encode KV in.

    ``bits`` defaults to 8 for INT8 and 4 for INT4 (2 gives INT2 KIVI, lossy).
    ``key_grouping`` defaults to "token" for INT8 and "channel" (KIVI) for INT4;
    values are always grouped per token. ``rank`` is required for LOW_RANK.
    """

    codec: Codec
    group_size: int = 32
    bits: int | None = None
    key_grouping: str | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        codec = Codec(self.codec)
        object.__setattr__(self, "codec", codec)
        if self.group_size < 2 or self.group_size % 4:
            raise CodecInputError(
                f"group_size must be a positive multiple of 4, got {self.group_size}"
            )
        if codec is Codec.INT8:
            bits = 8 if self.bits is None else self.bits
            if bits != 8:
                raise CodecInputError(f"INT8 takes bits=8, got {bits}")
        elif codec is Codec.INT4:
            bits = 4 if self.bits is None else self.bits
            if bits not in (4, 2):
                raise CodecInputError(f"INT4 takes bits=4 or bits=2, got {bits}")
        else:
            bits = self.bits
        object.__setattr__(self, "bits", bits)
        default_grouping = "channel" if codec is Codec.INT4 else "token"
        grouping = self.key_grouping or default_grouping
        if grouping not in ("channel", "token"):
            raise CodecInputError(f"key_grouping must be 'channel' or 'token', got {grouping!r}")
        object.__setattr__(self, "key_grouping", grouping)
        if codec is Codec.LOW_RANK and (self.rank is None or self.rank < 1):
            raise CodecInputError(f"LOW_RANK needs rank >= 1, got {self.rank}")

    @property
    def is_lossy(self) -> bool:
        return self.codec.is_lossy

    @property
    def label(self) -> str:
        """Short name for tables: full, int8, int4-kivi, int2-kivi, int4-tok, lowrank-r16."""
        if self.codec is Codec.INT8:
            return "int8" if self.key_grouping == "token" else "int8-kchan"
        if self.codec is Codec.INT4:
            return f"int{self.bits}-" + ("kivi" if self.key_grouping == "channel" else "tok")
        if self.codec is Codec.LOW_RANK:
            return f"lowrank-r{self.rank}"
        return self.codec.name.lower()

    @classmethod
    def full(cls) -> CodecSpec:
        return cls(codec=Codec.FULL)

    @classmethod
    def int8(cls, group_size: int = 32) -> CodecSpec:
        return cls(codec=Codec.INT8, group_size=group_size)

    @classmethod
    def int4(cls, key_grouping: str = "channel", group_size: int = 32) -> CodecSpec:
        return cls(codec=Codec.INT4, bits=4, key_grouping=key_grouping, group_size=group_size)

    @classmethod
    def int2(cls, key_grouping: str = "channel", group_size: int = 32) -> CodecSpec:
        return cls(codec=Codec.INT4, bits=2, key_grouping=key_grouping, group_size=group_size)

    @classmethod
    def low_rank(cls, rank: int) -> CodecSpec:
        return cls(codec=Codec.LOW_RANK, rank=rank)

    @classmethod
    def recompute(cls) -> CodecSpec:
        return cls(codec=Codec.RECOMPUTE)

    def to_dict(self) -> dict:
        return {
            "codec": int(self.codec),
            "group_size": self.group_size,
            "bits": self.bits,
            "key_grouping": self.key_grouping,
            "rank": self.rank,
        }


@dataclass(frozen=True, kw_only=True)
class EncodedKV:
    """One KV block in a codec's form.

    ``tensors`` hold everything needed to decode; ``nbytes`` is their exact
    total size (the compressed size). ``to_bytes()`` adds a small header.
    """

    spec: CodecSpec
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    dtype: torch.dtype
    tensors: Mapping[str, torch.Tensor]
    identity: bytes = b""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def input_nbytes(self) -> int:
        """Size of the uncompressed K and V this block stands for."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        # A RECOMPUTE entry built without tensors has empty shapes: it stands for no bytes.
        return sum(math.prod(s) for s in (self.k_shape, self.v_shape) if s) * itemsize

    @property
    def device(self) -> torch.device:
        first = next(iter(self.tensors.values()), None)
        return torch.device("cpu") if first is None else first.device

    def _meta(self) -> tuple[bytes, list[tuple[str, torch.Tensor, int]], int]:
        layout, offset = [], 0
        for name in sorted(self.tensors):
            t = self.tensors[name]
            layout.append((name, t, offset))
            offset += _aligned(t.numel() * t.element_size())
        meta = {
            "spec": self.spec.to_dict(),
            "k": list(self.k_shape),
            "v": list(self.v_shape),
            "dtype": dtype_name(self.dtype),
            "id": self.identity,
            "t": [[n, dtype_name(t.dtype), list(t.shape), o] for n, t, o in layout],
            "len": offset,
        }
        return msgpack.packb(meta), layout, offset

    def wire_size(self) -> int:
        """Exact length of ``to_bytes()``: header + metadata + aligned tensors."""
        meta, _, payload = self._meta()
        return _aligned(_WIRE_HEAD.size + len(meta)) + payload

    def write_into(self, out: memoryview | bytearray | np.ndarray) -> int:
        """Serialize into ``out`` (no intermediate buffer); returns bytes written."""
        meta, layout, payload = self._meta()
        body = _aligned(_WIRE_HEAD.size + len(meta))
        total = body + payload
        if isinstance(out, np.ndarray):
            dst = out.reshape(-1).view(np.uint8)
        else:
            dst = np.frombuffer(out, dtype=np.uint8)
        if dst.nbytes < total:
            raise CodecInputError(f"output buffer holds {dst.nbytes} bytes, need {total}")
        head = _WIRE_HEAD.pack(_WIRE_MAGIC, _WIRE_VERSION, len(meta)) + meta
        dst[: len(head)] = np.frombuffer(head, dtype=np.uint8)
        dst[len(head) : body] = 0
        for _, t, off in layout:
            raw = t.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy()
            end = body + off + raw.nbytes
            dst[body + off : end] = raw
            # Zero the alignment gap: no stale bytes of an earlier page ride along.
            dst[end : body + off + _aligned(raw.nbytes)] = 0
        return total

    def to_bytes(self) -> bytes:
        buf = bytearray(self.wire_size())
        self.write_into(buf)
        return bytes(buf)

    @classmethod
    def from_bytes(
        cls, buf: bytes | bytearray | memoryview, device: str | None = None
    ) -> EncodedKV:
        """Parse ``to_bytes()`` output; copies once, so ``buf`` may be reused afterwards."""
        view = memoryview(buf).cast("B")
        if len(view) < _WIRE_HEAD.size:
            raise EncodedFormatError(f"encoded KV truncated: {len(view)} bytes")
        magic, version, meta_len = _WIRE_HEAD.unpack_from(view)
        if magic != _WIRE_MAGIC:
            raise EncodedFormatError(f"bad encoded-KV magic {bytes(magic)!r}")
        if version != _WIRE_VERSION:
            raise EncodedFormatError(f"encoded-KV version {version}, expected {_WIRE_VERSION}")
        try:
            meta = msgpack.unpackb(bytes(view[_WIRE_HEAD.size : _WIRE_HEAD.size + meta_len]))
            spec = CodecSpec(**meta["spec"])
            body = _aligned(_WIRE_HEAD.size + meta_len)
            if len(view) < body + meta["len"]:
                raise EncodedFormatError(
                    f"encoded KV truncated: {len(view)} < {body + meta['len']}"
                )
            blob = torch.empty(meta["len"], dtype=torch.uint8)
            blob.numpy()[:] = np.frombuffer(view, dtype=np.uint8, count=meta["len"], offset=body)
            tensors = {}
            for name, dt, shape, off in meta["t"]:
                dtype = _TENSOR_DTYPES[dt]
                n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                t = blob[off : off + n].view(dtype).reshape(shape)
                tensors[name] = t if device is None else t.to(device)
            return cls(
                spec=spec,
                k_shape=tuple(meta["k"]),
                v_shape=tuple(meta["v"]),
                dtype=KV_DTYPES[meta["dtype"]],
                tensors=tensors,
                identity=meta["id"],
            )
        except (KeyError, TypeError, ValueError, RuntimeError, msgpack.ExtraData) as exc:
            if isinstance(exc, EncodedFormatError):
                raise
            raise EncodedFormatError(f"malformed encoded-KV metadata: {exc}") from exc


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True, kw_only=True)
class KVError:
    """Relative Frobenius error ||X - X_hat||_F / ||X||_F of K and of V."""

    rel_fro_k: float
    rel_fro_v: float

    @property
    def worst(self) -> float:
        return max(self.rel_fro_k, self.rel_fro_v)


def rel_fro(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    if x.shape != x_hat.shape:
        raise CodecInputError(f"shape mismatch: {tuple(x.shape)} vs {tuple(x_hat.shape)}")
    ref = x.detach().to(torch.float64)
    diff = torch.linalg.vector_norm(ref - x_hat.detach().to(ref.device, torch.float64))
    norm = torch.linalg.vector_norm(ref)
    if float(norm) == 0.0:
        return 0.0 if float(diff) == 0.0 else float("inf")
    return float(diff / norm)


def kv_error(k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor) -> KVError:
    """Relative Frobenius error of a decoded K/V pair against the originals."""
    return KVError(rel_fro_k=rel_fro(k, k_hat), rel_fro_v=rel_fro(v, v_hat))
