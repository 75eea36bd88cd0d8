"""Fuzz the real wire server: >= 5,000 malformed or random frames, no crash, no hang.

The server fronts the real service (every actor built in-process, real NIXL, real
sealing); a second, well-behaved client must keep working throughout.
"""

from __future__ import annotations

import socket
import struct
import tempfile
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv_cluster.api import protocol as p
from agentkv_cluster.api.client import AgentKvClient
from agentkv_cluster.config import load_config
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.runtime.service import Service

pytestmark = pytest.mark.integration

MAX_FRAME = 1 << 20
CODES = {c.value for c in p.ErrorCode}
OPS = ["hello", "open_session", "event", "store_pages", "lookup_prefix", "prepare_load",
       "complete_load", "release", "nope", ""]


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-fuzz-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0, "max_frame_bytes": MAX_FRAME, "read_timeout_s": 2.0},
        "hbm": {"page_bytes": 1 << 16, "num_pages": 16},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": 1 << 16, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def good(service):
    """A well-behaved client with one stored page, checked between fuzz frames."""
    client = service.client("acme")
    session = client.open_session("good")
    ident = PageIdentity(model_version="m", adapter_version="", tokenizer_version="t",
                         rope_config="r", tenant="acme", session="good", start=0, end=16,
                         event_version=1)
    data = np.arange(4096, dtype=np.uint8).tobytes()
    keys = session.store_pages([{"page_id": 0, "identity": ident.pack(), "data": data}])
    yield session, keys, data
    client.close()


class Fuzzer:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock: socket.socket | None = None

    def _conn(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=5.0)
        return self.sock

    def exchange(self, frame: bytes) -> dict | None:
        """Send one frame; return the decoded reply, or None if the server closed."""
        sock = self._conn()
        try:
            sock.sendall(frame)
            header = _recv(sock, 4)
            (length,) = struct.unpack(">I", header)
            return msgpack.unpackb(_recv(sock, length), raw=False)
        except ConnectionError:
            return None
        finally:
            if struct.unpack(">I", frame[:4])[0] > MAX_FRAME:  # the server closes after this
                self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                 st.text(max_size=20), st.binary(max_size=40))
values = st.recursive(leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
requests = st.fixed_dictionaries(
    {"v": st.one_of(st.just(1), st.integers(-3, 5), values),
     "id": st.one_of(st.integers(0, 2**63 - 1), values),
     "op": st.one_of(st.sampled_from(OPS), values)},
    optional={"auth": st.one_of(st.text(max_size=60), values),
              "args": st.one_of(st.dictionaries(st.sampled_from(
                  ["session", "event", "pages", "keys", "identities", "load_id"]), values,
                  max_size=4), values)})


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


frames = st.one_of(
    st.binary(min_size=1, max_size=200).map(_framed),  # random bodies
    values.map(lambda v: _framed(msgpack.packb(v, use_bin_type=True))),  # not a request
    requests.map(lambda r: _framed(msgpack.packb(r, use_bin_type=True))),  # near-requests
    st.integers(MAX_FRAME + 1, 2**32 - 1).map(lambda n: struct.pack(">I", n)),  # oversized
    st.just(struct.pack(">I", 0)),  # empty frame
)


def test_fuzz_5000_frames_no_crash_no_hang_others_served(service, good) -> None:
    fuzzer = Fuzzer(service.address)
    session, keys, data = good
    seen = {"replies": 0, "closed": 0, "frames": 0}

    @settings(max_examples=100, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(frames, min_size=50, max_size=50))
    def many(batch: list[bytes]) -> None:
        for frame in batch:
            one(frame)

    def one(frame: bytes) -> None:
        seen["frames"] += 1
        reply = fuzzer.exchange(frame)
        assert reply is not None  # every frame is answered, even the ones that end a connection
        seen["replies"] += 1
        assert reply["v"] == 1
        if struct.unpack(">I", frame[:4])[0] > MAX_FRAME:
            seen["closed"] += 1
            assert reply["error"]["code"] == "oversized"
        elif not reply["ok"]:
            assert reply["error"]["code"] in CODES
        if seen["frames"] % 500 == 0:  # the well-behaved client is still served
            prep = session.prepare_load(keys)
            assert [pg["source"] for pg in prep["pages"]] == ["hbm"]
            assert session.complete_load(prep["load_id"])["pages"][0]["data"] == data
            session.release(keys)

    many()
    assert seen["frames"] >= 5000
    assert seen["replies"] == seen["frames"]
    assert seen["closed"] > 0  # the oversized path (reply, then close) was exercised
    with AgentKvClient.connect(service.address, service.token("acme")) as fresh:
        assert fresh.hello()["versions"] == [1]


def test_unauthenticated_and_forged_tokens_are_refused(service) -> None:
    with AgentKvClient.connect(service.address, None) as anon:
        assert anon.hello()["server"] == "agentkv"  # hello needs no token
        with pytest.raises(p.RemoteError) as info:
            anon.open_session("x")
        assert info.value.code == "unauthenticated"
    forged = service.token("acme")[:-4] + "AAAA"
    with AgentKvClient.connect(service.address, forged) as bad:
        with pytest.raises(p.RemoteError) as info:
            bad.open_session("x")
        assert info.value.code == "unauthenticated"


def test_slow_client_mid_frame_is_dropped_without_blocking_others(service, good) -> None:
    stalled = socket.create_connection(service.address, timeout=10.0)
    stalled.sendall(struct.pack(">I", 100) + b"\x81")  # promises 100 bytes, sends 1
    session, keys, _ = good
    prep = session.prepare_load(keys)  # served while the other connection stalls
    assert prep["pages"][0]["source"] == "hbm"
    session.release(keys)
    assert stalled.recv(10) == b""  # closed after the 2 s read timeout, no reply
    stalled.close()


def test_metrics_health_and_readiness_endpoints(service, good) -> None:
    import urllib.error
    import urllib.request

    from agentkv_cluster.api.metrics import MetricsHttpServer

    session, keys, _ = good
    session.prepare_load(keys)
    session.release(keys)
    http = MetricsHttpServer(service.metrics, service.ready, port=0).start()
    base = f"http://127.0.0.1:{http.port}"
    try:
        assert urllib.request.urlopen(base + "/healthz").read() == b"ok\n"
        ready = urllib.request.urlopen(base + "/readyz").read().decode().splitlines()
        assert ready[0] == "ready" and "controller ok" in ready
        text = urllib.request.urlopen(base + "/metrics").read().decode()
        label = service.metrics.tenant("acme")  # a blinded id unless tenant_names is set
        assert f'agentkv_restore_delay_seconds_count{{source="hbm",tenant="{label}"}}' in text
        assert 'tenant="acme"' not in text
        assert 'agentkv_api_requests_total{code="ok",op="prepare_load"}' in text
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/nope")
        assert info.value.code == 404
    finally:
        http.stop()


def test_tenant_labels_are_bounded() -> None:
    from agentkv_cluster.api.metrics import OTHER, ServiceMetrics

    m = ServiceMetrics(top_tenants=2, tenant_names=True)
    for tenant in ("a", "b", "c", "d"):
        m.transfer(tenant, "host", 10)
    text = m.exposition().decode()
    assert 'tenant="a"' in text and 'tenant="b"' in text
    assert 'tenant="c"' not in text
    assert f'agentkv_transfer_bytes_total{{tenant="{OTHER}",tier="host"}} 20.0' in text
