"""A real vLLM engine, embedded backend with its NVMe tier in a given ``nvme_dir``: hints
whose field names are not all strings (the Python API takes any dict) are a clear error,
and a clean engine shutdown leaves nothing of its store behind.

The store is private to the worker process: its NVMe shard (``shard-<pid>``) is never
opened again by another engine. It used to stay in a given ``nvme_dir`` after shutdown
(only a temporary folder was removed): every restart left another shard, full of the
tenants' KV, on disk. Names of mixed types made the hint parser raise ``TypeError``
instead of ``HintError``: the request was served without AgentKV and no error said why."""

from __future__ import annotations

import pytest

from tests.integration.vllm.conftest import (
    generate,
    prompt,
    report,
    require_vllm,
    start_engine,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    require_vllm()
    nvme = tmp_path_factory.mktemp("agentkv-nvme")
    llm = start_engine({"backend": "embedded", "strategy": "lru", "host_blocks": 1,
                        "nvme_blocks": 16, "nvme_dir": str(nvme), "default_tenant": "acme"})
    state = {"llm": llm, "nvme": nvme, "open": True}
    yield state
    if state["open"]:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("hints, fragment", [
    ({"session": "x", 1: 2, "y": 3}, "unknown hint fields"),
    ({"session": "x", "events": [{"kind": "task_start", 1: 2, "x": 3}]}, "does not take"),
])
def test_hint_names_of_mixed_types_get_a_clear_error(engine, hints, fragment):
    out = generate(engine["llm"], "hello there, agent", hints, max_tokens=3)
    assert len(out.outputs[0].token_ids) == 3  # served (without AgentKV)
    errors = report(out).get("errors", [])
    assert any(fragment in e for e in errors), report(out)


def test_shutdown_removes_the_engines_shard_and_keeps_the_nvme_dir(engine):
    """Runs last in this module: it stops the engine."""
    llm, nvme = engine["llm"], engine["nvme"]
    out = generate(llm, prompt(41, 500), {"session": "s"}, max_tokens=2)
    assert "errors" not in report(out), report(out)
    shards = list(nvme.glob("shard-*"))
    assert shards and any(f.stat().st_size for s in shards for f in s.iterdir())  # demoted
    llm.llm_engine.engine_core.shutdown()
    engine["open"] = False
    assert nvme.is_dir()
    assert list(nvme.iterdir()) == []
