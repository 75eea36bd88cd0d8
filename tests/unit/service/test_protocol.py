"""Wire framing and request validation (pure; no sockets)."""

from __future__ import annotations

import msgpack
import pytest

from agentkv_cluster.api import protocol as p


def test_request_round_trip() -> None:
    frame = p.encode_request(7, "event", {"session": "s"}, "tok")
    length = p.frame_length(frame[:4], 1 << 20)
    req = p.decode_request(frame[4:])
    assert length == len(frame) - 4
    assert (req.version, req.request_id, req.op, req.auth, req.args) == (
        1, 7, "event", "tok", {"session": "s"})


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\xc1", p.ErrorCode.MALFORMED),  # never-used msgpack byte
        (msgpack.packb([1, 2]), p.ErrorCode.MALFORMED),
        (msgpack.packb({"v": 2, "id": 1, "op": "hello"}), p.ErrorCode.UNSUPPORTED_VERSION),
        (msgpack.packb({"v": True, "id": 1, "op": "hello"}), p.ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": -1, "op": "hello"}), p.ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "op": ""}), p.ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "op": "x", "args": [1]}), p.ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "op": "x", "auth": 5}), p.ErrorCode.MALFORMED),
        (msgpack.packb({1: 2}), p.ErrorCode.MALFORMED),  # non-string map key
    ],
)
def test_bad_requests_raise_the_right_code(body: bytes, code: p.ErrorCode) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_request(body)
    assert info.value.code is code


def test_oversized_frame_is_fatal_and_empty_is_not() -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.frame_length(p.HEADER.pack(1025), 1024)
    assert info.value.code is p.ErrorCode.OVERSIZED and info.value.fatal
    with pytest.raises(p.ProtocolError) as info:
        p.frame_length(p.HEADER.pack(0), 1024)
    assert info.value.code is p.ErrorCode.MALFORMED and not info.value.fatal


def test_error_reply_decodes_to_remote_error() -> None:
    frame = p.error_reply(9, p.ErrorCode.FORBIDDEN, "no")
    with pytest.raises(p.RemoteError) as info:
        p.decode_reply(frame[4:])
    assert (info.value.code, info.value.message) == ("forbidden", "no")
    assert p.decode_reply(p.ok_reply(3, {"a": b"b"})[4:])["result"] == {"a": b"b"}


def test_arg_checks_reject_bool_for_int() -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.arg({"load_id": True}, "load_id", int)
    assert info.value.code is p.ErrorCode.BAD_ARGS
    assert p.bytes_list({"keys": [b"a", b"b"]}, "keys") == [b"a", b"b"]
    with pytest.raises(p.ProtocolError):
        p.bytes_list({"keys": [b"a", "b"]}, "keys")


def test_a_client_refuses_an_oversized_request_unsent() -> None:
    """A 65 MiB ``store_pages`` reached the caller as ``ConnectionResetError`` (the server
    closes the stream on an oversized frame): the client now says so before sending."""
    import socket

    from agentkv_cluster.api.client import AgentKvClient

    ours, server = socket.socketpair()
    ours.settimeout(5.0)  # sent, it would block: nobody reads the other end
    try:
        client = AgentKvClient(ours, token=None, max_frame=1 << 20)
        with pytest.raises(p.ProtocolError) as refused:
            client.call("store_pages", {"session": "s", "pages": [b"x" * (1 << 20)]})
        assert refused.value.code is p.ErrorCode.OVERSIZED and "nothing was sent" in str(
            refused.value)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.recv(1)  # not a byte of it went out
    finally:
        ours.close()
        server.close()


def test_a_frame_of_empty_maps_is_refused_before_it_grows_the_server() -> None:
    """Each one-byte empty map decodes into a 64-byte dict: 1 MiB of them grew the server
    by 136 MB (8 MiB by 1.2 GB, the event loop held for seconds), unauthenticated. The
    decode stops at a bound set by the frame's size, and what it built stays near it."""
    import tracemalloc

    n = 1 << 20
    payload = b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    tracemalloc.start()
    try:
        with pytest.raises(p.ProtocolError, match="too many maps and arrays") as err:
            p.decode_request(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.code is p.ErrorCode.MALFORMED and err.value.request_id is None
    assert peak < 8 * len(payload), peak


def test_a_large_real_request_still_decodes_and_a_bad_one_echoes_its_id() -> None:
    pages = [{"page_id": i, "identity": {"tenant": "acme", "session": "s", "pos": i,
                                         "kind": "evidence", "tags": []},
              "shape": [2, 2, 2, 16, 8], "dtype": "float16", "data": b"\0" * 64}
             for i in range(5000)]
    body = msgpack.packb({"v": 1, "id": 9, "op": "store_pages", "args": {"pages": pages}})
    assert len(p.decode_request(body).args["pages"]) == 5000
    bad = msgpack.packb({"v": 1, "id": 9, "op": "", "args": {}})
    with pytest.raises(p.ProtocolError, match="'op'") as err:
        p.decode_request(bad)
    assert err.value.request_id == 9  # echoed without decoding the frame again
