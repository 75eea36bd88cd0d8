"""Reversible KV codecs: FULL, INT8, INT4/INT2 KIVI, LOW_RANK, RECOMPUTE entries.

``from store.codecs import encode_kv, decode_kv, CodecSpec, EncodedKV, kv_error``
"""

from store.codecs.kv import decode_kv, encode_kv
from store.codecs.reference import CodecReport, ReferenceCopy, RestoreCheck, measure, verify_restore
from store.codecs.spec import (
    CodecError,
    CodecInputError,
    CodecSpec,
    EncodedFormatError,
    EncodedKV,
    KVError,
    RecomputeRequired,
    kv_error,
)

__all__ = [
    "CodecError",
    "CodecInputError",
    "CodecReport",
    "CodecSpec",
    "EncodedFormatError",
    "EncodedKV",
    "KVError",
    "RecomputeRequired",
    "ReferenceCopy",
    "RestoreCheck",
    "decode_kv",
    "encode_kv",
    "kv_error",
    "measure",
    "verify_restore",
]
