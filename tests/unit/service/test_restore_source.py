"""Which copy a restore reads (``Strategy.restore_source``, tests/unit/service/).

``complete_load`` serves the FULL reference of a lossy working copy wherever the page has
one (the front's ``serve_exact``), so a lossy copy restored beside a FULL one costs its
own move and then the FULL one's: the engine waited for both. Found by review: with FULL
on NVMe and INT8 on the host, the AgentKV strategy picked the host copy (cheaper alone)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import KvShape
from agentkv_cluster.runtime.strategies import make_strategy
from store.types import Codec, Tier
from tests.unit.service.test_controller import MB, meta


def _page(strategy: str, copies: dict[Codec, Tier]) -> tuple[Controller, object]:
    ctl = Controller(make_strategy(strategy))
    ctl.add_hbm("h", 8 * MB)
    ctl.table.open_session("t", "s")
    m = replace(meta("s", 0, StateType.TASK_INPUT),
                shape=KvShape(layers=1, kv_heads=1, tokens=8, head_dim=4))
    out, _ = ctl.admit("t", "s", [m], 0.0)
    rec = ctl.table.pages[out[0][0]]
    rec.copies = dict(copies)
    return ctl, rec


@pytest.mark.parametrize("strategy", ["agentkv", "lru"])
def test_a_page_with_a_full_copy_restores_it_not_a_lossy_one(strategy: str) -> None:
    ctl, rec = _page(strategy, {Codec.FULL: Tier.NVME, Codec.INT8: Tier.HOST})
    assert ctl.strategy.restore_source(rec) == (Tier.NVME, Codec.FULL)


def test_without_a_full_copy_the_cheaper_lossy_copy_is_restored() -> None:
    ctl, rec = _page("agentkv", {Codec.INT8: Tier.NVME, Codec.INT4: Tier.HOST})
    assert ctl.strategy.restore_source(rec) == (Tier.HOST, Codec.INT4)
    ctl, rec = _page("agentkv", {Codec.INT8: Tier.HOST, Codec.INT4: Tier.NVME})
    assert ctl.strategy.restore_source(rec) == (Tier.HOST, Codec.INT8)
