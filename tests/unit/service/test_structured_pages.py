"""A page that feeds code or JSON output (``store_pages``'s ``structured``) keeps its
exact form on the service path: the risk controller's rule for it (paper §3.2) could not
fire, since nothing on the service set ``produces_structured`` (found by review). A draft
demoted by pressure with priced tiers, or migrated in a tool gap, leaves lossy; the same
draft marked structured leaves FULL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.records import ActionKind, KvShape, Reason
from agentkv_cluster.runtime.request_args import InvalidArgument, page_fields
from agentkv_cluster.runtime.strategies import make_strategy
from agentkv_cluster.runtime.tier_ledger import TierRoom
from store.types import Codec, Tier
from tests.integration.runtime.test_cluster import identity
from tests.unit.service.test_controller import MB, meta

SHAPE = KvShape(layers=1, kv_heads=1, tokens=8, head_dim=4)  # INT8 / INT4 can encode it


def _drafts(n: int, structured: set[int], hbm_mb: int) -> tuple[Controller, list[int]]:
    ctl = Controller(make_strategy("agentkv"))
    for _ in range(20):  # a tool the predictor knows: confident, no conservative fallback
        ctl.strategy.predictor.observe_tool("build", 5.0)
    ctl.add_hbm("h", hbm_mb * MB)
    ctl.table.open_session("t", "a")
    metas = [replace(meta("a", i, StateType.TEMP_REASONING), shape=SHAPE,
                     structured=i in structured) for i in range(n)]
    out, _ = ctl.admit("t", "a", metas, 0.0)
    ctl.ingested([g for g, _ in out])
    return ctl, [g for g, _ in out]


@pytest.mark.parametrize("structured", [False, True])
def test_a_structured_draft_is_demoted_full_where_a_plain_one_goes_lossy(structured) -> None:
    ctl, (gid,) = _drafts(1, structured={0} if structured else set(), hbm_mb=8)
    policy = ctl.table.hbms["h"].policy
    rec = ctl.table.pages[gid]
    rec.view.tool_class = "build"
    ctl.strategy.prepare(rec, 1.0)
    policy.on_update(rec.view, 1.0)
    room = TierRoom(free={Tier.HOST: 1 << 40, Tier.NVME: 1 << 40}, mu=(1e-3, 1e-3))
    codec = ctl.strategy.demotion(rec, policy, 1.0, room)[1]
    assert (codec is Codec.FULL) is structured, codec  # plain: lossy, else this shows nothing


def test_gap_migrations_keep_structured_drafts_full() -> None:
    ctl, gids = _drafts(4, structured={1, 3}, hbm_mb=4)  # full: above the gap watermark
    ev = ctl.events.translate("t", "a", {"event_id": 1, "task_id": "x", "version": 1,
                                         "ts": 0.1, "kind": "task_start",
                                         "prefix_generation": 1, "prefix_pages": [0]})
    ctl.apply(ev, 0.1)
    ev = ctl.events.translate("t", "a", {"event_id": 2, "task_id": "x", "version": 2,
                                         "ts": 0.2, "kind": "tool_start", "call_id": "k",
                                         "tool": "build"})
    due = ctl.apply(ev, 0.2)
    gap = {a.gid: a.codec for a in due + [a for _at, a in ctl.schedule]
           if a.kind is ActionKind.DEMOTE and a.reason is Reason.GAP}
    assert any(gap.get(gids[i]) not in (None, Codec.FULL) for i in (0, 2)), gap
    assert all(gap.get(gids[i], Codec.FULL) is Codec.FULL for i in (1, 3)), gap


def test_the_flag_is_true_or_false() -> None:
    ident = identity("acme", "s", 0)
    base = {"identity": ident.pack(), "page_id": 0}
    assert page_fields(base, 16, ident).structured is False
    assert page_fields(base | {"structured": True}, 16, ident).structured is True
    for bad in (1, 0, "true", None, [True]):
        try:
            page_fields(base | {"structured": bad}, 16, ident)
        except InvalidArgument as exc:
            assert "structured" in str(exc)
        else:
            raise AssertionError(f"structured={bad!r} was accepted")
