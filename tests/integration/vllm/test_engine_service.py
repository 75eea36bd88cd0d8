"""The connector inside a real vLLM engine with the AgentKV service as its backend (a
separate process, reached over TCP): restore is token-exact; killing the service with
SIGKILL mid-run leaves every request completing, by recompute."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.vllm.conftest import (
    ROOT,
    generate,
    prompt,
    report,
    require_vllm,
    start_engine,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BLOCK = 128


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    require_vllm()
    workdir = tmp_path_factory.mktemp("agentkv-service")
    secret = secrets.token_bytes(32)
    with open(workdir / "service.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.vllm.service_proc", str(workdir),
             secret.hex()], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while not (workdir / "address").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"service did not start: {(workdir / 'service.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield proc, workdir, secret
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def engine(service):
    _, workdir, _ = service
    # Timeouts far above a call's time on a loaded box: one slow call marks the service
    # down (or a lookup a miss), and the restore test would then see a recompute.
    llm = start_engine({"backend": "service", "service_address": (workdir / "address").read_text(),
                        "service_timeout_s": 30.0, "retry_after_s": 2.0,
                        "lookup_timeout_s": 30.0})
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm


def _token(secret: bytes, tenant: str) -> str:
    from security.principals import TokenIssuer

    return TokenIssuer(secret).issue(tenant, subject="agent", now=time.time())


def _wait_saved(workdir, blocks: int, timeout_s: float = 120.0) -> None:
    """Saves are asynchronous (a background writer in the worker, one page per block, in
    order): wait until the service holds ``blocks`` pages and its count stops moving."""
    deadline = time.monotonic() + timeout_s
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        pages = int((workdir / "pages").read_text())
        if pages != seen:
            seen, since = pages, time.monotonic()
        elif pages >= blocks and time.monotonic() - since >= 1.0:
            return
        time.sleep(0.1)
    pytest.fail(f"the service holds {seen} pages, {blocks} saves expected")


def _reset_when_freed(engine, timeout_s: float = 60.0) -> bool:
    """``reset_prefix_cache`` once vLLM freed every block: a request that carries its
    session's close keeps its blocks until the worker has written its saves."""
    deadline = time.monotonic() + timeout_s
    while not engine.reset_prefix_cache():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_restore_through_the_service_is_token_exact(service, engine):
    _, workdir, secret = service
    text = prompt(11)
    hints = {"session": "agent-s1", "token": _token(secret, "acme")}
    first = generate(engine, text, hints, max_tokens=12)
    _wait_saved(workdir, (len(first.prompt_token_ids) - 1) // BLOCK)
    assert engine.reset_prefix_cache()
    again = generate(engine, text, hints, max_tokens=12)
    assert list(again.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    restored = report(again)["restored_tokens"]
    assert restored == (len(first.prompt_token_ids) - 1) // BLOCK * BLOCK
    assert again.num_cached_tokens == restored
    assert "errors" not in report(again), report(again)


def test_the_request_that_ends_the_task_closes_its_session(service, engine):
    """``task_end``: once its request finished, the session is closed on the service and
    the blocks only it held retire, so another session of the tenant restores none of
    them (the session used to stay open, holding them, for as long as the engine ran)."""
    _, workdir, secret = service
    token, text = _token(secret, "acme"), prompt(12)
    before = int((workdir / "pages").read_text())
    first = generate(engine, text, {"session": "agent-e1", "token": token}, max_tokens=12)
    blocks = (len(first.prompt_token_ids) - 1) // BLOCK
    _wait_saved(workdir, before + blocks)
    assert engine.reset_prefix_cache()
    end = generate(engine, text, {"session": "agent-e1", "token": token,
                                  "events": [{"kind": "task_end"}]}, max_tokens=12)
    assert report(end)["restored_tokens"] == blocks * BLOCK  # restored before the close
    assert "errors" not in report(end), report(end)
    assert _reset_when_freed(engine)  # it carries the close: its blocks go after its saves
    other = generate(engine, text, {"session": "agent-e2", "token": token}, max_tokens=12)
    assert report(other)["restored_tokens"] == 0, report(other)


def test_killing_the_service_mid_run_every_request_completes(service, engine):
    from vllm import SamplingParams

    proc, _, secret = service
    texts = [prompt(20 + i) for i in range(4)]
    hints = {"session": "agent-k", "token": _token(secret, "acme")}
    sp = SamplingParams(max_tokens=24, temperature=0.0,
                        extra_args={"kv_transfer_params": {"agentkv": hints}})
    reference = [list(o.outputs[0].token_ids)
                 for o in engine.generate(texts[:1], sp, use_tqdm=False)]
    assert engine.reset_prefix_cache()

    killed_at: list[float] = []

    def kill_soon():
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_soon)
    killer.start()
    t0 = time.monotonic()
    outs = engine.generate(texts, sp, use_tqdm=False)  # in flight while the service dies
    done_at = time.monotonic()
    killer.join()
    assert killed_at and killed_at[0] < done_at, "the service died after the run, not during"
    assert proc.wait(10) == -signal.SIGKILL
    assert len(outs) == 4
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    assert list(outs[0].outputs[0].token_ids) == reference[0]
    # with the service gone: served by recompute, the outage reported, not hung
    assert engine.reset_prefix_cache()
    after = generate(engine, texts[0], hints, max_tokens=24)
    assert list(after.outputs[0].token_ids) == reference[0]
    assert report(after)["restored_tokens"] == 0
    assert any("unavailable" in e or "refused" in e for e in report(after)["errors"])
    assert time.monotonic() - t0 < 600
