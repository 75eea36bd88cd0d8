"""One contract for both backends of the vLLM connector, each real: the embedded store
(host pool + NVMe shard) and the AgentKV service (built in-process, reached over TCP).
No vLLM engine here: the worker side runs on real torch tensors laid out like vLLM's
paged KV cache (blocks at dim 0)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentkv_cluster.config import load_config
from agentkv_cluster.engines.vllm.backend import (
    PUBLIC_NAMESPACE,
    BackendUnavailable,
    CallerRefused,
    ConnectorCounters,
)
from agentkv_cluster.engines.vllm.blocks import (
    BlockGeometry,
    BlockMismatch,
    EngineVersions,
    block_identity,
    chain_hashes,
    open_block,
    seal_block,
)
from agentkv_cluster.engines.vllm.directory import TokenResolver
from agentkv_cluster.engines.vllm.embedded import EmbeddedBackend, EmbeddedSpec
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.service import ServiceBackend
from agentkv_cluster.engines.vllm.worker import WorkerSide
from agentkv_cluster.runtime.service import Service
from store.page import HEADER_SIZE

pytestmark = pytest.mark.integration

VERSIONS = EngineVersions(model_version="m@1", tokenizer_version="tok-1", rope_config="r")
BS = 16
GEOM = BlockGeometry(layers=2, per_layer=(3, BS, 8), dtype="float32")
PAGE = HEADER_SIZE + 2 * 3 * BS * 8 * 4


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-vllm-contract-"))
    cfg = load_config(env={}, overrides={
        "api": {"port": 0},
        "hbm": {"page_bytes": 1 << 16, "num_pages": 64},
        "pool": {"pool_bytes": 4 << 20, "slot_bytes": 1 << 16, "nvme_dir": str(workdir / "nv")},
    })
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _grant_publish(svc, tenant: str) -> None:
    """The operator's grant to publish into PUBLIC (the service also wants one; the
    embedded engine has no operator state: the token's publish role is the rule there)."""
    from security.publishing import PublishGrants

    PublishGrants(svc.front.keyring.source).grant(tenant, time.time())
    svc.front.grants.forget()


class Harness:
    """A backend plus a way to mint callers of a tenant (tokens signed by its secret)."""

    def __init__(self, backend, resolve, token):
        self.backend, self.resolve, self.token = backend, resolve, token

    def caller(self, tenant: str, session: str = "s", **claims):
        return self.resolve(self.token(tenant, **claims), session)


@pytest.fixture(params=["embedded", "service"])
def harness(request):
    if request.param == "embedded":
        secret = secrets.token_bytes(32)
        from security.principals import TokenIssuer
        issuer = TokenIssuer(secret)
        backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=4, nvme_blocks=8))
        resolver = TokenResolver(secret, default_tenant=None)

        def token(tenant, **kw):
            return issuer.issue(tenant, subject="agent", now=time.time(), **kw)
        yield Harness(backend, resolver.resolve, token)
        backend.close()
        return
    svc = request.getfixturevalue("service")
    _grant_publish(svc, "acme")
    backend = ServiceBackend(svc.address, timeout_s=5.0, retry_after_s=1.0)
    yield Harness(backend, backend.resolve, svc.token)
    backend.close()


def _ids(tokens, namespace, n=None):
    hashes = chain_hashes(tokens, BS)[:n]
    return [block_identity(VERSIONS, namespace=namespace, adapter="", chain=h, index=i,
                           block_size=BS) for i, h in enumerate(hashes)]


def _page(ident, seed):
    payload = torch.randn(2 * 3 * BS * 8, generator=torch.Generator().manual_seed(seed))
    return seal_block(ident, GEOM, payload.numpy().tobytes())


TOKENS = list(range(1000, 1000 + 4 * BS + 5))


def test_put_lookup_get_round_trip(harness):
    a = harness.caller("acme")
    ids = _ids(TOKENS, a.tenant)
    assert len(ids) == 4
    assert harness.backend.lookup(a, ids) == 0
    for i, ident in enumerate(ids[:3]):
        harness.backend.put(a, ident, _page(ident, i))
    assert harness.backend.lookup(a, ids) == 3  # the leading run, not the 4th
    got = harness.backend.get(a, ids[1])
    assert got == _page(ids[1], 1)
    assert bytes(open_block(got, ids[1], GEOM)) == bytes(open_block(_page(ids[1], 1), ids[1],
                                                                     GEOM))
    # another prompt that diverges in block 2 shares blocks 0-1 only (chain hashes)
    other = TOKENS[:2 * BS] + [7] * (2 * BS)
    assert harness.backend.lookup(a, _ids(other, a.tenant)) == 2


def test_tenant_never_matches_another_tenants_blocks(harness):
    a, b = harness.caller("acme"), harness.caller("globex")
    ids_a = _ids(TOKENS, a.tenant, 2)
    for i, ident in enumerate(ids_a):
        harness.backend.put(a, ident, _page(ident, i))
    # same prompt, other token: B's identities differ (tenant field) and miss
    assert harness.backend.lookup(b, _ids(TOKENS, b.tenant, 2)) == 0
    # naming A's namespace outright is refused
    with pytest.raises((CallerRefused, BackendUnavailable)):
        if harness.backend.lookup(b, ids_a):
            raise AssertionError("tenant B matched tenant A's blocks")
        raise CallerRefused("not matched")
    with pytest.raises(CallerRefused):
        harness.backend.put(b, ids_a[0], _page(ids_a[0], 0))


def test_public_namespace_is_opt_in(harness):
    admin = harness.caller("acme", roles=("tenant", "admin", "publish"))
    pub = _ids(TOKENS, PUBLIC_NAMESPACE, 2)
    with pytest.raises(CallerRefused):  # an admin without the publish role may not
        harness.backend.put(harness.caller("acme", roles=("tenant", "admin")), pub[0],
                            _page(pub[0], 10))
    for i, ident in enumerate(pub):
        harness.backend.put(admin, ident, _page(ident, 10 + i))
    opted = harness.caller("initech", public_read=True)
    assert harness.backend.lookup(opted, pub) == 2
    assert harness.backend.get(opted, pub[0]) == _page(pub[0], 10)
    not_opted = harness.caller("umbrella")
    with pytest.raises(CallerRefused):
        harness.backend.lookup(not_opted, pub)
    with pytest.raises(CallerRefused):  # only admins write PUBLIC
        harness.backend.put(opted, pub[0], _page(pub[0], 10))


def test_invalid_token_is_refused(harness):
    with pytest.raises(CallerRefused):
        harness.resolve("akv1.bm9wZQ.bm9wZQ", "s")


def test_lifecycle_events_are_accepted(harness):
    a = harness.caller("acme", session="agent-1")
    ident = _ids(TOKENS, a.tenant, 1)[0]
    harness.backend.put(a, ident, _page(ident, 0))
    for ev in (HintEvent(kind=HintKind.MODEL_CALL, call_id="m1"),
               HintEvent(kind=HintKind.TOOL_START, tool="search", call_id="t1"),
               HintEvent(kind=HintKind.OBSERVATION_RETURN, call_id="t1")):
        harness.backend.event(a, ev)
    assert harness.backend.lookup(a, [ident]) == 1


def test_damaged_or_foreign_page_is_never_opened():
    ids = _ids(TOKENS, "acme", 2)
    page = bytearray(_page(ids[0], 0))
    with pytest.raises(BlockMismatch, match="another identity"):
        open_block(bytes(page), ids[1], GEOM)
    page[HEADER_SIZE + 5] ^= 0xFF
    with pytest.raises(BlockMismatch, match="damaged"):
        open_block(bytes(page), ids[0], GEOM)
    other = BlockGeometry(layers=2, per_layer=(3, BS, 8), dtype="float16")
    with pytest.raises(BlockMismatch, match="geometry"):
        open_block(_page(ids[0], 0), ids[0], other)


def test_embedded_tiers_demote_then_drop_and_report():
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=2, nvme_blocks=2,
                                           strategy="lru"))
    try:
        a = TokenResolver(None, "acme").resolve(None, "s")
        ids = _ids(list(range(6 * BS)), "acme")
        for i, ident in enumerate(ids[:5]):
            backend.put(a, ident, _page(ident, i))
        st = backend.stats()
        assert (st["host_blocks"], st["nvme_blocks"]) == (2, 2)  # block 0 dropped (LRU)
        assert backend.take_dropped() == {ids[0].digest()}
        assert backend.get(a, ids[0]) is None
        assert backend.get(a, ids[1]) == _page(ids[1], 1)  # promoted from NVMe intact
    finally:
        backend.close()


def test_agentkv_strategy_retires_ended_tasks_lru_keeps_them():
    for strategy, kept in (("agentkv", 0), ("lru", 2)):
        backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=4, nvme_blocks=4,
                                               strategy=strategy))
        try:
            a = TokenResolver(None, "acme").resolve(None, "done-task")
            for i, ident in enumerate(_ids(TOKENS, "acme", 2)):
                backend.put(a, ident, _page(ident, i))
            backend.event(a, HintEvent(kind=HintKind.TASK_END))
            assert backend.stats()["blocks"] == kept, strategy
        finally:
            backend.close()


def _kv(num_blocks=8):
    gen = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.self_attn.attn": torch.randn(num_blocks, 3, BS, 8, generator=gen)
            for i in range(2)}


def test_worker_save_then_load_restores_bit_exact_and_rejects_corruption():
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=8, nvme_blocks=0))
    try:
        counters = ConnectorCounters()
        src = WorkerSide(backend, counters)
        src.register_kv_caches(_kv())
        a = TokenResolver(None, "acme").resolve(None, "s")
        ids = _ids(TOKENS, "acme", 3)
        src.wait_for_save(AgentKVConnectorMetadata(requests=[RequestOps(
            "r1", a, saves=tuple(BlockOp(ident, b) for b, ident in zip((5, 2, 7), ids)))]))
        assert src.flush(10.0) and counters.saved_blocks == 3
        dst_kv = {k: torch.zeros_like(v) for k, v in _kv().items()}
        dst = WorkerSide(backend, counters)
        dst.register_kv_caches(dst_kv)
        # corrupt the third block's bytes in the host pool: it must not be loaded
        slot = backend._blocks[ids[2].digest()].slot
        raw = bytearray(backend._pool.read(slot))
        raw[-1] ^= 0x01
        backend._pool.write(slot, bytes(raw))
        dst.start_load_kv(AgentKVConnectorMetadata(requests=[RequestOps(
            "r2", a, loads=tuple(BlockOp(ident, b) for b, ident in zip((1, 3, 4), ids)))]))
        for name, kv in _kv().items():
            assert torch.equal(dst_kv[name][1], kv[5]) and torch.equal(dst_kv[name][3], kv[2])
            assert not dst_kv[name][4].any()  # the damaged block was never written
        assert dst.take_load_errors() == {4}
        assert counters.rejected_blocks == 1 and counters.restored_tokens == 2 * BS
        src.close()
        dst.close()
    finally:
        backend.close()


def test_dead_service_fails_fast_and_is_reported(service):
    cfg = load_config(env={}, overrides={"api": {"port": 0},
                                         "hbm": {"page_bytes": 1 << 16, "num_pages": 8}})
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-vllm-dead-"))
    svc = Service(cfg, workdir=workdir).start(local=True)
    backend = ServiceBackend(svc.address, timeout_s=2.0, retry_after_s=30.0)
    a = backend.resolve(svc.token("acme"), "s")
    ident = _ids(TOKENS, "acme", 1)[0]
    backend.put(a, ident, _page(ident, 0))
    svc.stop()
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable):
        backend.lookup(a, [ident])
    with pytest.raises(BackendUnavailable):  # marked down: no second wait
        backend.get(a, ident)
    assert time.monotonic() - t0 < 5.0
    backend.close()
    shutil.rmtree(workdir, ignore_errors=True)


def test_another_tenants_task_end_never_retires_a_shared_public_block():
    """A block remembers its readers as (tenant, session): a PUBLIC reader that ends tasks
    under the session names other tenants use no longer retires the block for them (the
    embedded store kept bare session names)."""
    secret = secrets.token_bytes(32)
    from security.principals import TokenIssuer

    issuer = TokenIssuer(secret)
    resolver = TokenResolver(secret, default_tenant=None)
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=4, nvme_blocks=8))

    def caller(tenant, session, **kw):
        return resolver.resolve(issuer.issue(tenant, subject="a", now=time.time(), **kw), session)
    try:
        ident = _ids(TOKENS, PUBLIC_NAMESPACE, 1)[0]
        page = _page(ident, 7)
        backend.put(caller("pubco", "agent-1", roles=("tenant", "admin", "publish")), ident, page)
        reader = caller("tenanth", "h-1", public_read=True)
        assert backend.get(reader, ident) == page
        for session in ("agent-1", "h-1"):  # the others' session names, another tenant
            other = caller("tenantg", session, public_read=True)
            assert backend.get(other, ident) == page
            backend.event(other, HintEvent(kind=HintKind.TASK_END))
        assert backend.lookup(reader, [ident]) == 1 and backend.get(reader, ident) == page
    finally:
        backend.close()


def test_an_abandoned_branch_retires_its_own_blocks_not_the_prefix_others_continue_from():
    """Requests tagged with a branch: abandoning it retires the blocks only it wrote or
    read; the session's prefix, read by the trunk, stays for the next branch (before, a
    branch_abandoned retired every block of the session). task_end retires them all."""
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=8, nvme_blocks=0,
                                           strategy="agentkv"))
    try:
        trunk = TokenResolver(None, "acme").resolve(None, "agent-b")
        branch = replace(trunk, branch="try-1")
        ids = _ids(TOKENS, "acme", 4)
        for i in (0, 1):  # the shared prefix, written by the trunk
            backend.put(trunk, ids[i], _page(ids[i], i))
        assert backend.get(branch, ids[0]) == _page(ids[0], 0)  # the branch reads it too
        for i in (2, 3):  # what the branch alone wrote
            backend.put(branch, ids[i], _page(ids[i], i))
        backend.event(branch, HintEvent(kind=HintKind.BRANCH_ABANDONED, branch="try-1"))
        assert backend.lookup(trunk, ids) == 2  # the prefix stays, the branch's blocks went
        assert backend.stats()["blocks"] == 2
        backend.event(trunk, HintEvent(kind=HintKind.TASK_END))
        assert backend.stats()["blocks"] == 0
    finally:
        backend.close()


def test_branch_abandoned_without_tagged_requests_keeps_the_session_when_named():
    """A framework that abandons a named branch but never tagged its requests: nothing is
    known to be that branch's, so nothing is retired (the policy ages the blocks out); an
    unnamed branch_abandoned retires the untagged blocks, as before."""
    backend = EmbeddedBackend(EmbeddedSpec(slot_bytes=PAGE, host_blocks=8, nvme_blocks=0,
                                           strategy="agentkv"))
    try:
        a = TokenResolver(None, "acme").resolve(None, "agent-u")
        ids = _ids(TOKENS, "acme", 2)
        for i, ident in enumerate(ids):
            backend.put(a, ident, _page(ident, i))
        backend.event(a, HintEvent(kind=HintKind.BRANCH_ABANDONED, branch="b7"))
        assert backend.stats()["blocks"] == 2
        backend.event(a, HintEvent(kind=HintKind.BRANCH_ABANDONED))
        assert backend.stats()["blocks"] == 0
    finally:
        backend.close()
