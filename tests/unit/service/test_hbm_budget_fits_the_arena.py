"""The HBM budget the controller places pages by must fit the arena the HBM actors have.

`agentkv demo --sessions 32` (or more) asked for a budget larger than its fixed 96-page
arena; the controller then placed pages the HBM actor had no page for, and stores failed
with `ArenaFull` as internal errors ('op store_pages failed')."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.workload import WorkloadSpec
from agentkv_cluster.cli._demo_fits import (
    DEMO_ARENA_PAGES,
    DEMO_PAGE_BYTES,
    arena_pages,
    hbm_capacity,
)
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service


@pytest.mark.parametrize("sessions", [8, 32, 100, 400])
def test_the_demo_arena_holds_its_budget(sessions: int) -> None:
    _, capacity = hbm_capacity(WorkloadSpec(sessions=sessions, turns=3, seed=227), 0.35)
    pages = arena_pages(capacity)
    assert pages * DEMO_PAGE_BYTES >= capacity
    assert pages == DEMO_ARENA_PAGES or pages * DEMO_PAGE_BYTES < capacity + DEMO_PAGE_BYTES


def test_the_default_demo_keeps_the_arena_it_was_tuned_with() -> None:
    _, capacity = hbm_capacity(WorkloadSpec(sessions=8, turns=3, seed=227), 0.35)
    assert arena_pages(capacity) == DEMO_ARENA_PAGES


@pytest.mark.parametrize("capacity", [0, -1, 8 * 4096 + 1])
def test_a_service_refuses_a_budget_outside_its_arena(capacity: int, tmp_path) -> None:
    cfg = load_config(env={}, overrides={"hbm": {"page_bytes": 4096, "num_pages": 8}})
    with pytest.raises(ValueError, match=r"hbm_capacity .* must be in \(0, 32768\]"):
        Service(cfg, workdir=tmp_path, hbm_capacity=capacity)
    Service(cfg, workdir=tmp_path, hbm_capacity=8 * 4096)  # the whole arena is fine


def test_a_replayed_traces_budget_holds_one_warm_up_session(tmp_path) -> None:
    """The warm-up runs synthetic sessions before a trace is replayed: a trace of small
    one-call sessions (Azure) gave a budget of 4 pages, smaller than one warm-up session,
    and every warm-up store was refused ('HBM is full of pinned pages')."""
    import json

    from agentkv_cluster.api.workload import episodes_from_trace
    from agentkv_cluster.cli._demo_fits import warmup_spec

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(
        {"session": f"r{i}", "ts": float(i), "kind": "model_call", "tokens": 512,
         "prefix_blocks": [i]}) + "\n" for i in range(6)))
    episodes = episodes_from_trace(trace, "agentkv", 6, memory_bytes=64 << 20,
                                   max_page_bytes=DEMO_PAGE_BYTES)
    spec = WorkloadSpec(sessions=len(episodes), turns=3, seed=227, episodes=episodes)
    spec, capacity = hbm_capacity(spec, 0.35)
    assert capacity >= warmup_spec(spec).largest_session()
    assert capacity >= 2 * spec.largest_session()
