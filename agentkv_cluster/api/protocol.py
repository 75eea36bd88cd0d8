"""The AgentKV wire protocol: length-prefixed msgpack frames (see docs/protocol.md).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of a
msgpack map. Requests carry ``v`` (protocol version), ``id`` (request id echoed in
the reply), ``op``, ``auth`` (bearer token; only ``hello`` may omit it) and
``args``. Replies carry ``v``, ``id``, ``ok`` and either ``result`` or ``error``
(``code``, ``message``). This module is pure: no sockets, no service state.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})
HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 64 << 20
PREAUTH_MAX_FRAME = 64 << 10  # larger frames need an authenticated connection under load
MAX_REQUEST_ID = (1 << 63) - 1


class ErrorCode(str, enum.Enum):
    MALFORMED = "malformed"  # not msgpack, not a map, missing/ill-typed fields
    OVERSIZED = "oversized"  # length prefix above the server's max frame size
    UNSUPPORTED_VERSION = "unsupported_version"
    UNAUTHENTICATED = "unauthenticated"  # missing or invalid token
    FORBIDDEN = "forbidden"  # valid token, but not for this session/namespace
    UNKNOWN_OP = "unknown_op"
    BAD_ARGS = "bad_args"  # op known, arguments invalid
    NOT_FOUND = "not_found"  # session / page / load id unknown
    BUSY = "busy"  # too many connections; retry later
    TENANT_ERASED = "tenant_erased"  # the tenant was erased while the request ran
    PAGE_LOST = "page_lost"  # the service lost a page (no copy left): recompute it
    INTERNAL = "internal"  # a bug or a backend failure; the request had no effect


class ProtocolError(Exception):
    """A request that must be answered with an error reply."""

    def __init__(self, code: ErrorCode, message: str, *, fatal: bool = False,
                 request_id: int | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal  # the stream cannot be resynchronised: close after replying
        self.request_id = request_id  # to echo, where the request decoded that far


class RemoteError(Exception):
    """Client side: the server answered with an error reply (``code``: an ``ErrorCode``
    value, or a code newer than this client, kept as it came)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class PageLostError(RemoteError):
    """Client side: ``page_lost``. Not the caller's fault: the service has no usable copy
    of a page the request needs (its HBM actor died with its only copy, or its copies
    could not be brought back); recompute the page (re-prefill) and store it again. A
    subclass of ``RemoteError``, so code that catches that catches this too."""


_REMOTE_ERRORS: dict[str, type[RemoteError]] = {ErrorCode.PAGE_LOST.value: PageLostError}


def remote_error(code: str, message: str) -> RemoteError:
    """The client exception of an error reply: its own class where the code has one."""
    return _REMOTE_ERRORS.get(code, RemoteError)(code, message)


@dataclass(frozen=True, kw_only=True)
class Request:
    version: int
    request_id: int
    op: str
    auth: str | None
    args: dict[str, Any]


def pack_frame(body: dict[str, Any]) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def frame_length(header: bytes, max_frame: int) -> int:
    """Parse a length prefix; oversized or empty frames are protocol errors."""
    (length,) = HEADER.unpack(header)
    if length > max_frame:
        raise ProtocolError(
            ErrorCode.OVERSIZED, f"frame of {length} bytes exceeds {max_frame}", fatal=True
        )
    if length == 0:
        raise ProtocolError(ErrorCode.MALFORMED, "empty frame")
    return length


# Maps and arrays one frame may decode into: a floor, plus one per this many bytes. Each
# becomes a Python object of 56-64 bytes from one byte of msgpack, so a frame of empty
# maps grew the server by 136 MB per MiB (and held the event loop while it did); bounded
# so, a frame costs at most about 4x its size. A request's real containers (pages, their
# identities and shapes, events) each take far more than 16 bytes.
MIN_CONTAINERS = 4096
BYTES_PER_CONTAINER = 16


class _TooManyContainers(Exception):
    pass


def _unpack(payload: bytes, max_frame: int) -> Any:
    left = MIN_CONTAINERS + len(payload) // BYTES_PER_CONTAINER

    def counted(container: Any) -> Any:
        nonlocal left
        left -= 1
        if left < 0:
            raise _TooManyContainers
        return container

    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True,
                               object_hook=counted, list_hook=counted)
    except _TooManyContainers:
        raise ProtocolError(ErrorCode.MALFORMED, "too many maps and arrays for the frame's "
                            f"size (at most {MIN_CONTAINERS} + 1 per {BYTES_PER_CONTAINER} "
                            "bytes)") from None
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"not a msgpack message: {type(exc).__name__}")


def peek_request_id(obj: Any) -> int | None:
    """The request id to echo even when the rest of the request is invalid."""
    if isinstance(obj, dict):
        rid = obj.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= MAX_REQUEST_ID:
            return rid
    return None


def decode_request(payload: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> Request:
    """The request in ``payload``; a ``ProtocolError`` carries the id to echo where the
    message decoded and had one (the server decoded a bad frame twice to find it)."""
    obj = _unpack(payload, max_frame)
    try:
        return _request(obj)
    except ProtocolError as exc:
        exc.request_id = peek_request_id(obj)
        raise


def _request(obj: Any) -> Request:
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "message must be a map")
    version = obj.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError(ErrorCode.MALFORMED, "field 'v' must be an integer")
    if version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"version {version} unsupported; server speaks {sorted(SUPPORTED_VERSIONS)}",
        )
    rid = peek_request_id(obj)
    if rid is None:
        raise ProtocolError(ErrorCode.MALFORMED, "field 'id' must be an integer 0..2**63-1")
    op = obj.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError(ErrorCode.MALFORMED, "field 'op' must be a non-empty string")
    auth = obj.get("auth")
    if auth is not None and not isinstance(auth, str):
        raise ProtocolError(ErrorCode.MALFORMED, "field 'auth' must be a string")
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "field 'args' must be a map")
    return Request(version=version, request_id=rid, op=op, auth=auth, args=args)


def encode_request(request_id: int, op: str, args: dict[str, Any], auth: str | None) -> bytes:
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": op, "args": args}
    if auth is not None:
        body["auth"] = auth
    return pack_frame(body)


def ok_reply(request_id: int | None, result: Any) -> bytes:
    return pack_frame({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def error_reply(request_id: int | None, code: ErrorCode, message: str) -> bytes:
    return pack_frame({
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": False,
        "error": {"code": code.value, "message": message[:512]},
    })


def decode_reply(payload: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> dict[str, Any]:
    """Client side: parse a reply frame body, raising ``RemoteError`` for error replies."""
    obj = _unpack(payload, max_frame)
    if not isinstance(obj, dict) or "ok" not in obj:
        raise ProtocolError(ErrorCode.MALFORMED, "reply must be a map with 'ok'")
    if not obj["ok"]:
        err = obj.get("error") or {}
        raise remote_error(str(err.get("code", "unknown")), str(err.get("message", "")))
    return obj


# --- argument checking shared by every op --------------------------------------------


def arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], *,
        optional: bool = False) -> Any:
    """Fetch ``args[name]`` checked against ``kind`` (bool is never an int here)."""
    if name not in args or args[name] is None:
        if optional:
            return None
        raise ProtocolError(ErrorCode.BAD_ARGS, f"missing argument {name!r}")
    value = args[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ProtocolError(ErrorCode.BAD_ARGS, f"argument {name!r} has the wrong type")
    if not isinstance(value, kinds):
        raise ProtocolError(ErrorCode.BAD_ARGS, f"argument {name!r} has the wrong type")
    return value


def bytes_list(args: dict[str, Any], name: str, *, max_items: int = 4096,
               distinct: bool = False) -> list[bytes]:
    """``args[name]``: a list of at most ``max_items`` bytes, each at most once if
    ``distinct`` (page keys of one load or release: a page named twice is a client bug)."""
    items = arg(args, name, list)
    if len(items) > max_items:
        raise ProtocolError(ErrorCode.BAD_ARGS, f"{name!r} holds more than {max_items} items")
    if not all(isinstance(x, bytes) for x in items):
        raise ProtocolError(ErrorCode.BAD_ARGS, f"{name!r} must be a list of bytes")
    if distinct and len(set(items)) != len(items):
        raise ProtocolError(ErrorCode.BAD_ARGS, f"{name!r} names an item more than once")
    return items
