"""Page identity (§2.5): what must match before a KV page may be reused zero-copy."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, fields

_MAGIC = b"AKVI"
_FORMAT = 1
_HEAD = struct.Struct("<4sB")
_LEN = struct.Struct("<H")
_INTS = struct.Struct("<QQQ")
_STR_FIELDS = (
    "model_version", "adapter_version", "tokenizer_version", "rope_config", "tenant", "session",
)
_MAX_STR = 0xFFFF
_MAX_INT = 2**64 - 1


class IdentityError(ValueError):
    """A page identity that is invalid or cannot be unpacked."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PageIdentity:
    """Everything a KV page's bytes depend on, plus its position and event version.

    ``adapter_version`` is ``""`` for the base model. ``rope_config`` is a
    canonical string chosen by the engine adapter (e.g. ``"theta=1e6;scale=1"``).
    """

    model_version: str
    adapter_version: str
    tokenizer_version: str
    rope_config: str
    tenant: str
    session: str
    start: int  # first token position (inclusive)
    end: int  # last token position (exclusive)
    event_version: int

    def __post_init__(self) -> None:
        for name in _STR_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise IdentityError(f"{name} must be str, got {type(value).__name__}")
            if len(value.encode()) > _MAX_STR:
                raise IdentityError(f"{name} is longer than {_MAX_STR} bytes")
        for name in ("model_version", "tokenizer_version", "tenant"):
            if not getattr(self, name):
                raise IdentityError(f"{name} must not be empty")
        for name in ("start", "end", "event_version"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= _MAX_INT:
                raise IdentityError(f"{name} must be an int in [0, 2**64), got {value!r}")
        if self.end <= self.start:
            raise IdentityError(f"empty token range [{self.start}, {self.end})")

    def pack(self) -> bytes:
        """Canonical bytes: magic, format, length-prefixed UTF-8 strings, u64 ints."""
        parts = [_HEAD.pack(_MAGIC, _FORMAT)]
        for name in _STR_FIELDS:
            raw = getattr(self, name).encode()
            parts.append(_LEN.pack(len(raw)))
            parts.append(raw)
        parts.append(_INTS.pack(self.start, self.end, self.event_version))
        return b"".join(parts)

    @classmethod
    def unpack(cls, data: bytes) -> PageIdentity:
        view = memoryview(data)
        try:
            magic, fmt = _HEAD.unpack_from(view, 0)
            if magic != _MAGIC:
                raise IdentityError(f"bad magic {bytes(magic)!r}")
            if fmt != _FORMAT:
                raise IdentityError(f"unsupported identity format {fmt}")
            offset = _HEAD.size
            strings: dict[str, str] = {}
            for name in _STR_FIELDS:
                (n,) = _LEN.unpack_from(view, offset)
                offset += _LEN.size
                if offset + n > len(view):
                    raise IdentityError(f"truncated in {name}")
                strings[name] = bytes(view[offset : offset + n]).decode()
                offset += n
            start, end, event_version = _INTS.unpack_from(view, offset)
        except (struct.error, UnicodeDecodeError) as exc:
            raise IdentityError(f"cannot unpack page identity: {exc}") from exc
        if offset + _INTS.size != len(view):
            raise IdentityError("trailing bytes after page identity")
        return cls(**strings, start=start, end=end, event_version=event_version)

    def digest(self) -> bytes:
        """32-byte BLAKE2b of ``pack()``: stable across processes and runs."""
        return hashlib.blake2b(self.pack(), digest_size=32, person=b"agentkv-page-id").digest()

    def mismatches(self, other: PageIdentity) -> tuple[str, ...]:
        """Names of the fields that differ, in declaration order."""
        return tuple(
            f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)
        )

    def compatible_with(self, other: PageIdentity) -> bool:
        """Zero-copy reuse only when every field matches: no partial compatibility."""
        return not self.mismatches(other)
