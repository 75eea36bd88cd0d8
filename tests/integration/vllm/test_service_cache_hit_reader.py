"""The vLLM connector on the AgentKV service: a request whose whole prompt vLLM's own prefix
cache serves makes its session a holder of the blocks the service stores of that prompt,
so another session's close (its ``task_end``) does not retire a prefix this one runs on.
The embedded store does the same through the step's held blocks
(``tests/unit/engines/test_vllm_embedded_retire.py``). Before, such a request made no call
to the service at all (its admission only), and the prefix retired with its writer.
No vLLM engine: the scheduler side runs on stand-ins for vLLM's requests; the service is
real (in-process actors, reached over TCP)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agentkv_cluster.engines.vllm.backend import ConnectorCounters
from agentkv_cluster.engines.vllm.scheduler import SchedulerSide
from agentkv_cluster.engines.vllm.service import ServiceBackend
from tests.integration.vllm.test_backend_contract import BS, VERSIONS, _page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

BLOCKS = 3


@pytest.fixture(scope="module")
def svc():
    with local_service("agentkv-vllm-cache-hit-", page_bytes=1 << 16, hbm_pages=64,
                       pool_bytes=4 << 20) as service:
        yield service


def _request(req_id: str, session: str, token: str, first: int) -> SimpleNamespace:
    ids = list(range(first, first + BLOCKS * BS + 1))
    return SimpleNamespace(request_id=req_id, prompt_token_ids=ids, all_token_ids=ids,
                           output_token_ids=[], num_computed_tokens=0, lora_request=None,
                           cache_salt=None,
                           kv_transfer_params={"agentkv": {"session": session, "token": token}})


def _settled(sched: SchedulerSide, request: SimpleNamespace, local: int) -> None:
    """vLLM asks until the lookup thread has admitted the request (and claimed its hit)."""
    deadline = time.monotonic() + 10.0
    sched.arrived(request)
    while True:
        assert sched.get_num_new_matched_tokens(request, local) == (0, False)
        st = sched._reqs[request.request_id]
        if st.lookup is not None and st.lookup.done():
            st.lookup.result()
            return
        assert time.monotonic() < deadline, "the lookup thread never finished"
        time.sleep(0.01)


@pytest.mark.parametrize("hit", [BLOCKS * BS, 0])
def test_a_prompt_served_from_vllms_cache_keeps_its_prefix_when_the_writer_closes(svc, hit):
    """``hit``: the tokens vLLM's cache holds of the reader's prompt (the whole prompt's
    full blocks, or none: then nothing marks the reader, and the prefix goes)."""
    backend = ServiceBackend(svc.address, timeout_s=5.0, retry_after_s=0.2)
    sched = SchedulerSide(backend, VERSIONS, BS, ConnectorCounters(), remote=True,
                          lookup_timeout_s=5.0, min_tail_tokens=0)
    token = svc.token("acme")
    try:
        writer = backend.resolve(token, f"writer-{hit}")
        probe = _request("probe", "x", token, first=500 + hit)  # a prompt of its own
        ids = sched.matcher.identities(probe, [], BLOCKS, writer.tenant)
        for i, ident in enumerate(ids):
            backend.put(writer, ident, _page(ident, i))
        reader_request = _request(f"r-{hit}", f"reader-{hit}", token, first=500 + hit)
        if hit:
            _settled(sched, reader_request, hit)
        assert backend.end_session(writer)  # the writer's task_end
        third = backend.resolve(svc.token("acme"), f"third-{hit}")
        assert backend.lookup(third, ids) == (BLOCKS if hit else 0)  # (third holds them now)
        for last in (backend.resolve(token, f"reader-{hit}"), third):
            assert backend.end_session(last)
        fourth = backend.resolve(svc.token("acme"), f"fourth-{hit}")
        assert backend.lookup(fourth, ids) == 0  # its last holders gone, the prefix went
    finally:
        sched.close()
        backend.close()
