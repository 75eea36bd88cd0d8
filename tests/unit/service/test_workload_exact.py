"""``agentkv demo --exact`` (``WorkloadSpec.exact``): every page the workload stores is
``structured``, so the risk controller keeps it FULL and both policies serve exact bytes
only (``tests/unit/service/test_structured_pages.py`` shows the flag's effect)."""

from __future__ import annotations

import argparse

import pytest

from agentkv_cluster.api.workload import WorkloadSpec, _Episode
from agentkv_cluster.cli.demo import _spec, register


@pytest.mark.parametrize("exact", [False, True])
def test_every_page_carries_the_spec_s_exact_flag(exact: bool) -> None:
    ep = _Episode(WorkloadSpec(sessions=1, turns=1, seed=3, exact=exact), 0, "agentkv0")
    pages = [ep.page(kind) for kind in ("fixed_prefix", "temp_reasoning", "tool_observation")]
    assert [p["structured"] for p in pages] == [exact] * 3


@pytest.mark.parametrize("argv", [[], ["--exact"]])
def test_the_demo_flag_reaches_the_spec(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["demo", *argv])
    assert _spec(args).exact is bool(argv)
