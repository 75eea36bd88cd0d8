"""The demo's HBM budget is counted as the service charges pages: whole arena pages.

A page of 128-384 tokens is 256-768 KiB of KV but costs one 1 MiB arena page of the
HBM budget. Sized from raw page bytes, "35 % of the working set" held 16 arena pages of
88 (18 %), fewer than one whole session at its last resume needs twice over."""

from __future__ import annotations

from agentkv_cluster.api.workload import WorkloadSpec
from agentkv_cluster.cli._demo_fits import DEMO_PAGE_BYTES, hbm_capacity


def test_budget_is_a_fraction_of_the_charged_working_set():
    raw = WorkloadSpec(sessions=8, turns=3, seed=1)
    spec, capacity = hbm_capacity(raw, 0.35)
    assert spec.charge_bytes == DEMO_PAGE_BYTES
    pages_per_session = 2 + 3 * raw.turns
    working_pages = raw.sessions * pages_per_session
    held = capacity // DEMO_PAGE_BYTES
    assert held >= int(0.35 * working_pages)  # 30 of 88 arena pages
    assert held >= 2 * pages_per_session  # two whole sessions fit at their last resume
    assert spec.working_set() == working_pages * DEMO_PAGE_BYTES


def test_each_page_costs_at_least_its_bytes():
    spec, _ = hbm_capacity(WorkloadSpec(), 0.35)
    for tokens in (*spec.tokens, 2048):
        assert spec.charged(tokens) >= spec.page_bytes(tokens)
        assert spec.charged(tokens) % DEMO_PAGE_BYTES == 0
