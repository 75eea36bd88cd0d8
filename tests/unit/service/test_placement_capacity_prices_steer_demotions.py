"""Eq. 5's capacity prices steer the service's demotions (tests/unit/service/).

``test_controller_paper`` checks that prices are computed (``tier_prices``) and that full
tiers are avoided (free bytes), but not that a price is *used*: a demotion that ignored
``TierRoom.mu`` passed the whole unit suite. Here the same victim, with both tiers
roomy, goes to the host at zero prices and to NVMe once host bytes are priced."""

from __future__ import annotations

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.runtime.controller import Controller
from agentkv_cluster.runtime.strategies import make_strategy
from agentkv_cluster.runtime.tier_ledger import TierRoom
from store.types import Tier
from tests.unit.service.test_controller import MB, meta

ROOMY = {Tier.HOST: 1 << 40, Tier.NVME: 1 << 40}


def _victim() -> tuple[Controller, object]:
    ctl = Controller(make_strategy("agentkv"))
    ctl.add_hbm("h", 64 * MB)
    ctl.table.open_session("t", "s")
    out, _ = ctl.admit("t", "s", [meta("s", 0, StateType.EVIDENCE)], 0.0)
    ctl.ingested([g for g, _ in out])
    rec = ctl.table.pages[out[0][0]]
    ctl.strategy.prepare(rec, 1.0)
    return ctl, rec


def test_a_priced_host_tier_sends_the_victim_to_nvme() -> None:
    ctl, rec = _victim()
    policy = ctl.table.hbms["h"].policy
    free = ctl.strategy.demotion(rec, policy, 1.0, TierRoom(free=ROOMY, mu=(0.0, 0.0)))
    priced = ctl.strategy.demotion(rec, policy, 1.0, TierRoom(free=ROOMY, mu=(1e-3, 0.0)))
    assert free[0] is Tier.HOST
    assert priced[0] is Tier.NVME  # the host byte now costs more than the slower restore


def test_a_priced_nvme_tier_keeps_the_victim_on_the_host() -> None:
    ctl, rec = _victim()
    policy = ctl.table.hbms["h"].policy
    both = ctl.strategy.demotion(rec, policy, 1.0, TierRoom(free=ROOMY, mu=(1e-3, 1.0)))
    assert both[0] is Tier.HOST
