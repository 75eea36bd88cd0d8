"""Full-precision reference copies beside lossy working copies, and verified restores."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from store.codecs.kv import decode_kv, encode_kv
from store.codecs.spec import CodecError, CodecInputError, CodecSpec, EncodedKV, KVError, kv_error


class ReferenceCorrupted(CodecError):
    """A reference copy no longer matches the digest taken when it was captured."""


def _digest(k: torch.Tensor, v: torch.Tensor) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for x in (k, v):
        h.update(x.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy().data)
    return h.digest()


@dataclass(frozen=True, kw_only=True)
class ReferenceCopy:
    """An exact FULL copy of a KV block plus a BLAKE2b digest of its bytes."""

    full: EncodedKV
    digest: bytes

    @classmethod
    def capture(cls, k: torch.Tensor, v: torch.Tensor, device: str = "cpu") -> ReferenceCopy:
        full = encode_kv(k.to(device), v.to(device), CodecSpec.full())
        return cls(full=full, digest=_digest(full.tensors["k"], full.tensors["v"]))

    @property
    def nbytes(self) -> int:
        return self.full.nbytes

    def restore(
        self, device: str | torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact K and V, checked against the capture digest."""
        if _digest(self.full.tensors["k"], self.full.tensors["v"]) != self.digest:
            raise ReferenceCorrupted("reference copy bytes changed since capture")
        return decode_kv(self.full, device)

    def to_bytes(self) -> bytes:
        return self.digest + self.full.to_bytes()

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> ReferenceCopy:
        view = memoryview(buf)
        return cls(digest=bytes(view[:32]), full=EncodedKV.from_bytes(view[32:]))


@dataclass(frozen=True, kw_only=True)
class RestoreCheck:
    """Outcome of comparing a restored block to its reference copy."""

    ok: bool
    error: KVError
    max_rel_error: float


def verify_restore(
    reference: ReferenceCopy,
    k_hat: torch.Tensor,
    v_hat: torch.Tensor,
    *,
    max_rel_error: float = 0.0,
) -> RestoreCheck:
    """Compare a restored K/V to the reference. ``max_rel_error=0`` demands bit equality.

    Shape or dtype mismatches raise CodecInputError: that is a wrong page, not a lossy one.
    """
    k, v = reference.restore(device=k_hat.device)
    for name, ref, got in (("k", k, k_hat), ("v", v, v_hat)):
        if ref.shape != got.shape or ref.dtype != got.dtype:
            raise CodecInputError(
                f"restored {name} is {got.dtype} {tuple(got.shape)}, "
                f"reference is {ref.dtype} {tuple(ref.shape)}"
            )
    err = kv_error(k, v, k_hat, v_hat)
    if max_rel_error == 0.0:
        ok = torch.equal(k, k_hat) and torch.equal(v, v_hat)
    else:
        ok = err.worst <= max_rel_error
    return RestoreCheck(ok=ok, error=err, max_rel_error=max_rel_error)


@dataclass(frozen=True, kw_only=True)
class CodecReport:
    """Exact compressed size and error of one codec on one KV block."""

    spec: CodecSpec
    input_nbytes: int
    nbytes: int
    error: KVError

    @property
    def ratio(self) -> float:
        """Compressed size / input size (smaller is better); 1.0 for an empty block."""
        return self.nbytes / self.input_nbytes if self.input_nbytes else 1.0


def measure(k: torch.Tensor, v: torch.Tensor, spec: CodecSpec) -> tuple[EncodedKV, CodecReport]:
    """Encode, decode and report exact size and relative Frobenius error."""
    enc = encode_kv(k, v, spec)
    k_hat, v_hat = decode_kv(enc)
    report = CodecReport(
        spec=spec,
        input_nbytes=enc.input_nbytes,
        nbytes=enc.nbytes,
        error=kv_error(k, v, k_hat, v_hat),
    )
    return enc, report
