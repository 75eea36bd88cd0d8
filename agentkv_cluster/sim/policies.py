"""Names -> drivers around the policy classes of ``agentkv_cluster.policy``.

The paper's order (Table 4) plus ARC as an extra baseline. Each batch gets a
fresh policy object: batches are independent working sets. ``signals`` gives a
baseline the end-of-life signals it acts on (the fair baselines get all of
them; the paper-faithful ones none). AgentKV always acts on every signal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agentkv_cluster.policy.base import EndOfLife, Mechanisms
from agentkv_cluster.policy.baselines import ArcPolicy, LruPolicy, SemanticPolicy, TtlPolicy
from agentkv_cluster.policy.predictor import Predictor
from agentkv_cluster.sim.config import SimConfig
from agentkv_cluster.sim.drivers import FullPrecisionDriver, PolicyDriver
from agentkv_cluster.sim.workload import Batch

POLICY_NAMES: tuple[str, ...] = ("lru", "ttl", "semantic", "agentkv", "arc")
BASELINES: tuple[str, ...] = tuple(n for n in POLICY_NAMES if n != "agentkv")


DriverFactory = Callable[[Batch], PolicyDriver]


def driver_factory(name: str, cfg: SimConfig, *, mechanisms: Mechanisms | None = None,
                   signals: Iterable[EndOfLife] = ()) -> DriverFactory:
    """Per-run factory: a fresh policy per batch; AgentKV's predictor persists across
    batches (it learns tool durations and reuse online, as the service's would), and so
    does its return model (how idle gaps ended)."""
    sig = frozenset(signals)
    if name == "lru":
        return lambda batch: FullPrecisionDriver(LruPolicy(signals=sig), cfg)
    if name == "ttl":
        return lambda batch: FullPrecisionDriver(TtlPolicy(signals=sig), cfg)
    if name == "semantic":
        return lambda batch: FullPrecisionDriver(SemanticPolicy(signals=sig), cfg)
    if name == "arc":
        return lambda batch: FullPrecisionDriver(
            ArcPolicy(batch.capacity_bytes, signals=sig), cfg)
    if name == "agentkv":
        from agentkv_cluster.policy.returns import ReturnModel
        from agentkv_cluster.sim.agentkv_driver import AgentKvDriver, PredictionSkill

        predictor = Predictor()
        skill = PredictionSkill()
        returns = ReturnModel()
        mech = mechanisms or Mechanisms()
        return lambda batch: AgentKvDriver(cfg, mech, predictor, skill, returns)
    raise KeyError(name)
