"""Names -> drivers around the policy classes of ``agentkv_cluster.policy``.

The paper's order (Table 4) plus ARC as an extra baseline. Each batch gets a
fresh policy object: batches are independent working sets.
"""

from __future__ import annotations

from collections.abc import Callable

from agentkv_cluster.policy.base import Mechanisms
from agentkv_cluster.policy.baselines import ArcPolicy, LruPolicy, SemanticPolicy, TtlPolicy
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver, PolicyDriver
from agentkv_cluster.sim.workload import Batch

POLICY_NAMES: tuple[str, ...] = ("lru", "ttl", "semantic", "agentkv", "arc")


DriverFactory = Callable[[Batch], PolicyDriver]


def driver_factory(name: str, cfg: SimConfig, *,
                   mechanisms: Mechanisms | None = None) -> DriverFactory:
    """Per-run factory: a fresh policy per batch; AgentKV's predictor persists across
    batches (it learns tool durations online, as the service's would)."""
    if name == "lru":
        return lambda batch: FullPrecisionDriver(LruPolicy(), cfg)
    if name == "ttl":
        return lambda batch: FullPrecisionDriver(TtlPolicy(), cfg)
    if name == "semantic":
        return lambda batch: FullPrecisionDriver(SemanticPolicy(), cfg)
    if name == "arc":
        return lambda batch: FullPrecisionDriver(ArcPolicy(batch.capacity_bytes), cfg)
    if name == "agentkv":
        from agentkv_cluster.sim.agentkv_driver import AgentKvDriver

        predictor = Predictor()
        mech = mechanisms or Mechanisms()
        return lambda batch: AgentKvDriver(cfg, mech, predictor)
    raise KeyError(name)
