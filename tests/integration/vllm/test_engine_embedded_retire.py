"""A real vLLM engine, embedded backend: a ``task_end`` takes effect only once no request
of its session is in flight. vLLM runs two requests at a time here, so of three requests
of one session sent together (one running long, one carrying ``task_end``, one waiting in
vLLM's queue) the third starts after the task_end's request finished. It used to find
its prefix retired by then (restored 0, recomputed); now it restores it, and the
session's blocks retire after the last of them."""

from __future__ import annotations

import time

import pytest

from tests.integration.vllm.conftest import (
    prompt,
    report,
    require_vllm,
    start_engine,
    token_secret,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BLOCK = 128  # vLLM's CPU block size


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    require_vllm()
    from security.principals import TokenIssuer

    secret, secret_file = token_secret(tmp_path_factory)
    llm = start_engine({"backend": "embedded", "strategy": "agentkv", "host_blocks": 64,
                        "nvme_blocks": 0, "token_secret_file": secret_file,
                        "default_tenant": None}, gpu_blocks=40, max_num_seqs=2)
    token = TokenIssuer(secret).issue("acme", subject="agent", now=time.time())
    yield llm, token
    llm.llm_engine.engine_core.shutdown()
    del llm


def _params(token: str, session: str, max_tokens: int, events: list | None = None):
    from vllm import SamplingParams

    hints = {"session": session, "token": token, **({"events": events} if events else {})}
    return SamplingParams(max_tokens=max_tokens, temperature=0.0,
                          extra_args={"kv_transfer_params": {"agentkv": hints}})


def test_a_task_end_waits_for_the_request_of_its_session_still_queued(engine):
    llm, token = engine
    running, queued, ending = prompt(101), prompt(102), prompt(103, words=200)
    first = llm.generate([running, queued], [_params(token, "s", 4)] * 2, use_tqdm=False)
    assert llm.reset_prefix_cache()
    outs = llm.generate([running, ending, queued],
                        [_params(token, "s", 30), _params(token, "s", 1, [{"kind": "task_end"}]),
                         _params(token, "s", 4)], use_tqdm=False)
    for out in outs:
        assert "errors" not in report(out), report(out)
    full = (len(first[1].prompt_token_ids) - 1) // BLOCK * BLOCK
    assert report(outs[0])["restored_tokens"] == full
    assert report(outs[2])["restored_tokens"] == full  # was 0: retired before it started
    # after the last of them, the session's blocks retire (with the next engine step)
    llm.generate([prompt(104, words=20)], _params(token, "idle", 4), use_tqdm=False)
    assert llm.reset_prefix_cache()
    again = llm.generate([running], _params(token, "s2", 1), use_tqdm=False)[0]
    assert report(again) == {"restored_tokens": 0, "tenant": "acme"}
