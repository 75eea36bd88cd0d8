"""Every simulator parameter, in one frozen config (paper Table 3 plus the cost model).

The workload calibration lives here and only here: policies never see these
numbers except through the page records the simulator hands them, and no value
is tuned per policy. ``docs/simulator.md`` documents each one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentkv_cluster.lifecycle.types import StateType

MB = 1_000_000  # the paper reports decimal megabytes and GB/s
PRESETS = ("paper", "agent-loop")


class SimConfigError(ValueError):
    """A simulator parameter is out of its documented range."""


@dataclass(frozen=True, kw_only=True)
class TypeParams:
    """Ground truth of one state type: how often it appears and how it behaves."""

    mix: float  # share of the 32 blocks of a batch
    reuse_prob: float  # P(the page is read again after its idle gap)
    recompute_ms_per_mb: float  # re-prefill / tool re-run cost per MB of KV
    correctness_weight: float  # damage of a wrong restore (structured output, code)
    idle_median_s: float  # median tool idle time before the next access
    idle_sigma: float  # log-normal shape of that idle time (heavy tail)


# Paper Table 3: mix 7/10/18/20/12/23/10 %; fixed prefix reuse 0.99, failed branch
# 0.12; verified results carry the highest recompute and quality weights; evidence
# and tool observations idle longest. The paper's "tool definition" share is
# carried by TASK_INPUT (the seven lifecycle types of Table 1).
DEFAULT_TYPES: Mapping[StateType, TypeParams] = MappingProxyType(
    {
        StateType.FIXED_PREFIX: TypeParams(
            mix=0.07, reuse_prob=0.99, recompute_ms_per_mb=0.6,
            correctness_weight=0.6, idle_median_s=1.5, idle_sigma=0.8),
        StateType.TASK_INPUT: TypeParams(
            mix=0.10, reuse_prob=0.80, recompute_ms_per_mb=0.6,
            correctness_weight=0.7, idle_median_s=2.0, idle_sigma=0.8),
        StateType.EVIDENCE: TypeParams(
            mix=0.18, reuse_prob=0.55, recompute_ms_per_mb=1.5,
            correctness_weight=0.6, idle_median_s=6.0, idle_sigma=1.1),
        StateType.TOOL_OBSERVATION: TypeParams(
            mix=0.20, reuse_prob=0.60, recompute_ms_per_mb=1.8,
            correctness_weight=0.5, idle_median_s=5.0, idle_sigma=1.1),
        StateType.VERIFIED_RESULT: TypeParams(
            mix=0.12, reuse_prob=0.70, recompute_ms_per_mb=2.5,
            correctness_weight=1.0, idle_median_s=3.0, idle_sigma=0.9),
        StateType.TEMP_REASONING: TypeParams(
            mix=0.23, reuse_prob=0.30, recompute_ms_per_mb=0.4,
            correctness_weight=0.3, idle_median_s=2.0, idle_sigma=0.9),
        StateType.FAILED_BRANCH: TypeParams(
            mix=0.10, reuse_prob=0.12, recompute_ms_per_mb=0.2,
            correctness_weight=0.1, idle_median_s=2.0, idle_sigma=0.9),
    }
)

class SignalQualityError(SimConfigError):
    """A signal-quality parameter is out of range."""


@dataclass(frozen=True, kw_only=True)
class SignalQuality:
    miss: float = 0.0  # P(a true end-of-life signal is lost)
    delay_s: float = 0.0  # lateness of every delivered signal
    false_rate: float = 0.0  # P(a page still to be read gets a premature signal)

    def __post_init__(self) -> None:
        if not 0.0 <= self.miss <= 1.0:
            raise SignalQualityError(f"signal miss must be in [0, 1], got {self.miss}")
        if not 0.0 <= self.false_rate <= 1.0:
            raise SignalQualityError(f"signal false rate must be in [0, 1], got {self.false_rate}")
        if not (self.delay_s >= 0.0 and math.isfinite(self.delay_s)):
            raise SignalQualityError(f"signal delay must be a finite number >= 0, "
                                     f"got {self.delay_s}")

    @property
    def perfect(self) -> bool:
        return self.miss == 0.0 and self.delay_s == 0.0 and self.false_rate == 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """Host -> HBM restore path: 24 GB/s, 1.2 ms fixed, queueing jitter."""

    bandwidth_gbps: float = 24.0  # decimal GB/s
    fixed_overhead_ms: float = 1.2
    jitter_mean_ms: float = 0.35  # exponential per restore: contention from other work
    nvme_bandwidth_gbps: float = 6.0
    nvme_overhead_ms: float = 2.5


@dataclass(frozen=True, kw_only=True)
class ToolClass:
    """One tool of the agent-loop preset: its log-normal duration."""

    name: str
    median_s: float
    sigma: float


@dataclass(frozen=True, kw_only=True)
class AgentLoopConfig:
    """The agent-loop preset: sessions of model calls separated by tool calls, each
    call reading the whole context so far (docs/simulator.md)."""

    sessions_per_batch: int = 2  # concurrent sessions sharing one HBM budget
    calls_min: int = 4  # model calls per session, uniform in [calls_min, calls_max]
    calls_max: int = 12
    model_median_s: float = 1.0  # model latency between a read and its tool call
    model_sigma: float = 0.5
    tools: tuple[ToolClass, ...] = (
        ToolClass(name="read_file", median_s=0.25, sigma=0.8),
        ToolClass(name="bash", median_s=1.5, sigma=1.2),
        ToolClass(name="search", median_s=3.0, sigma=1.0),
        ToolClass(name="test", median_s=8.0, sigma=0.8),
    )
    page_median_mb: float = 12.0  # KV of one call's new context (observation, output)
    page_sigma: float = 0.6
    prefix_mb: float = 24.0  # shared system prompt + tool schema
    abandon_prob: float = 0.25  # a call's reasoning page is an abandoned branch
    supersede_prob: float = 0.2  # a later observation supersedes an earlier one


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """Table 3 workload: batches of concurrent state blocks."""

    batches: int = 3000
    blocks_per_batch: int = 32
    size_min_mb: float = 8.0
    size_max_mb: float = 220.0
    size_median_mb: float = 46.0
    size_sigma: float = 0.55
    build_window_s: float = 6.0  # blocks of a batch are produced over this window
    max_reads: int = 1  # reads of one page after it is produced, at most
    types: Mapping[StateType, TypeParams] = field(default_factory=lambda: DEFAULT_TYPES)
    preset: str = "paper"  # "paper" (Table 3) or "agent-loop"
    agent_loop: AgentLoopConfig = field(default_factory=AgentLoopConfig)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """The root config; printed with every result and written into the JSON."""

    seed: int = 0
    budget: float = 0.35  # HBM capacity as a fraction of each batch's working set
    noise: float = 0.35  # prediction log-error sigma
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    compression_ratio: float = 3.2  # AgentKV's INT4 copies, effective (paper Table 3)
    signals: SignalQuality = field(default_factory=SignalQuality)  # as delivered
    cost_error: float = 0.35  # log-error sigma of the cost model's recompute-time estimate

    def __post_init__(self) -> None:
        validate(self)

    def replace(self, **changes: Any) -> SimConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)


def validate(cfg: SimConfig) -> None:
    wl = cfg.workload
    checks = [
        (0.0 < cfg.budget <= 1.0, f"budget must be in (0, 1], got {cfg.budget}"),
        (0.0 <= cfg.noise <= 3.0, f"noise must be in [0, 3], got {cfg.noise}"),
        (0.0 <= cfg.cost_error <= 3.0, f"cost_error must be in [0, 3], got {cfg.cost_error}"),
        (wl.batches >= 1, f"batches must be >= 1, got {wl.batches}"),
        (wl.blocks_per_batch >= 1, f"blocks_per_batch must be >= 1, got {wl.blocks_per_batch}"),
        (0.0 < wl.size_min_mb < wl.size_max_mb, "need 0 < size_min_mb < size_max_mb"),
        (wl.size_sigma > 0.0, "size_sigma must be > 0"),
        (wl.max_reads >= 1, f"max_reads must be >= 1, got {wl.max_reads}"),
        (wl.preset in PRESETS,
         f"workload preset must be one of {', '.join(PRESETS)}, got {wl.preset!r}"),
        (1 <= wl.agent_loop.calls_min <= wl.agent_loop.calls_max,
         "need 1 <= calls_min <= calls_max"),
        (cfg.link.bandwidth_gbps > 0.0, "bandwidth_gbps must be > 0"),
        (cfg.compression_ratio >= 1.0, "compression_ratio must be >= 1"),
        (cfg.seed >= 0, f"seed must be >= 0, got {cfg.seed}"),
    ]
    for ok, message in checks:
        if not ok:
            raise SimConfigError(message)
    mix = sum(p.mix for p in wl.types.values())
    if not math.isclose(mix, 1.0, abs_tol=1e-9):
        raise SimConfigError(f"type mix must sum to 1, got {mix}")
    for st, p in wl.types.items():
        if not 0.0 <= p.reuse_prob <= 1.0:
            raise SimConfigError(f"{st.name}: reuse_prob must be in [0, 1]")
        if p.idle_median_s <= 0.0 or p.idle_sigma <= 0.0:
            raise SimConfigError(f"{st.name}: idle time parameters must be > 0")


def config_to_dict(cfg: SimConfig) -> dict[str, Any]:
    wl = cfg.workload
    return {
        "seed": cfg.seed,
        "budget": cfg.budget,
        "noise": cfg.noise,
        "compression_ratio": cfg.compression_ratio,
        "cost_error": cfg.cost_error,
        "workload": {
            "preset": wl.preset,
            "batches": wl.batches,
            "blocks_per_batch": wl.blocks_per_batch,
            "size_mb": {"min": wl.size_min_mb, "max": wl.size_max_mb,
                        "median": wl.size_median_mb, "sigma": wl.size_sigma},
            "build_window_s": wl.build_window_s,
            "max_reads": wl.max_reads,
            "types": {st.name.lower(): dataclasses.asdict(p) for st, p in wl.types.items()},
        },
        "link": dataclasses.asdict(cfg.link),
        "signals": cfg.signals.to_dict(),
        **({"agent_loop": dataclasses.asdict(wl.agent_loop)} if wl.preset == "agent-loop"
           else {}),
    }
