"""A real vLLM engine with the AgentKV service: the session a ``task_end`` ends is closed
on the service only once none of its requests is in flight and the worker has written
their saves. The close used to go out as soon as the ``task_end`` request finished, and
another request of the session still running then had its saves refused (lost)."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.vllm.conftest import generate, prompt, report, start_engine
from tests.integration.vllm.test_engine_service import _token, service  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BLOCK = 128


@pytest.fixture(scope="module")
def engine(service, tmp_path_factory, monkeypatch_module):  # noqa: F811
    _, workdir, _ = service
    stats = tmp_path_factory.mktemp("stats") / "worker.json"
    monkeypatch_module.setenv("AGENTKV_VLLM_STATS", str(stats))
    llm = start_engine({"backend": "service",
                        "service_address": (workdir / "address").read_text(),
                        "service_timeout_s": 30.0, "retry_after_s": 2.0,
                        "lookup_timeout_s": 30.0})
    yield llm, stats
    llm.llm_engine.engine_core.shutdown()
    del llm


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _pages(workdir) -> int:
    return int((workdir / "pages").read_text())


def _settled(workdir, timeout_s: float = 120.0) -> int:
    """The service's page count once it stopped moving for 2 s."""
    deadline = time.monotonic() + timeout_s
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        pages = _pages(workdir)
        if pages != seen:
            seen, since = pages, time.monotonic()
        elif time.monotonic() - since >= 2.0:
            return pages
        time.sleep(0.1)
    return seen


def test_a_task_end_waits_for_the_sessions_requests_in_flight(service, engine):  # noqa: F811
    from vllm import SamplingParams

    _, workdir, secret = service
    llm, stats = engine
    token = _token(secret, "acme")
    before = _pages(workdir)
    long_text, end_text = prompt(41), prompt(42, words=200)
    running = SamplingParams(max_tokens=40, temperature=0.0, extra_args={
        "kv_transfer_params": {"agentkv": {"session": "agent-c1", "token": token}}})
    ending = SamplingParams(max_tokens=1, temperature=0.0, extra_args={
        "kv_transfer_params": {"agentkv": {"session": "agent-c1", "token": token,
                                           "events": [{"kind": "task_end"}]}}})
    # both run in the first step; the task_end request finishes first, while the other
    # is still decoding and its prompt blocks are still being written
    outs = llm.generate([long_text, end_text], [running, ending], use_tqdm=False)
    for out in outs:
        assert "errors" not in report(out), report(out)
    _settled(workdir)
    generate(llm, prompt(43, words=20), None, max_tokens=2)  # a step: the worker's stats
    counters = json.loads(stats.read_text())
    assert counters["save_failures"] == 0, counters
    assert counters["saved_blocks"] >= (len(outs[0].prompt_token_ids) - 1) // BLOCK
    # and the session was closed once both had finished: the blocks only it held retire
    deadline = time.monotonic() + 60
    while _pages(workdir) > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pages(workdir) == before
