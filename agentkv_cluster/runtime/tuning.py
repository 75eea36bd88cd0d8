"""What the service knows of its own machine and pages: measured costs, tuned settings.

The pure policy core (``agentkv_cluster/policy``) is written for the paper's hardware and
blocks; the service runs it with these: the restore and re-prefill costs measured through
the real actors and model on the reference machine, and the value profile, gap and
predictor settings tuned on seeds the reports never use.
``set_type`` gives a page its Table 1 priors with this machine's re-prefill cost.
"""

from __future__ import annotations

from dataclasses import replace

from agentkv_cluster.lifecycle.types import TYPE_DEFAULTS, StateType
from agentkv_cluster.policy.agentkv import AgentKvConfig
from agentkv_cluster.policy.base import CostModel, PageView
from agentkv_cluster.policy.gap import GapConfig
from agentkv_cluster.policy.predictor import PredictorConfig
from agentkv_cluster.policy.value import PROFILES
from store.types import Tier

# Restore cost through the real actors on the 2-core reference machine (NIXL + AES-GCM +
# torch dequantisation), so the gap planner's T_move is this service's, not the paper's.
# Fixed overheads include two actor round trips on a busy box (measured 10-60 ms). A FULL
# copy lands in HBM in one hop (a landing page); a lossy one goes through the HBM actor,
# which decodes it: `agentkv demo` on seeds 101-108 restored host pages at a median of
# 7 ms more per page in resumes that were mostly lossy than in mostly-FULL ones.
RUNTIME_COST = CostModel(
    link_bytes_per_s={Tier.HBM: 8e9, Tier.HOST: 0.5e9, Tier.NVME: 0.3e9},
    fixed_overhead_s={Tier.HBM: 0.0, Tier.HOST: 0.03, Tier.NVME: 0.04},
    codec_bytes_per_s=0.3e9,
    codec_fixed_s=0.008,
)
# Agent tool calls in a deployment last ~0.1-10 s; the service trusts a tool class's
# observed durations after one sample (prior_weight=1) and calls a gap "short" below 0.1 s.
# Prefetches aim to finish by the 10th percentile of the predicted return: one that lands
# late turns the resume into a foreground restore of the whole session (the tail LRU
# lives in), one that lands early only holds HBM a little longer. `agentkv demo --seed S`
# on a quiet box, AgentKV/LRU P95 for S = 3, 5, 7, 11, 13: 0.70, 0.62, 0.97, 0.40, 1.06
# aiming at the 25th percentile; 0.80, 0.43, 0.19, 0.33, 0.64 aiming at the 10th.
#
# eta (eq. 3's weight on C_occupy, GB x predicted idle seconds) is the paper's for blocks of
# 8-220 MB. The service's pages are ~1 MB: at eta 0.2 a second of predicted idle moves a
# page's value by 2e-4, next to 0.1-0.3 for its type's terms, and the victim order ignores
# when a page will be read (it evicted pages whose session returned next while keeping
# those of sessions a second away). At 300 a second of predicted idle weighs about what
# the correctness term does. Tuned on `agentkv demo` seeds 101-108 (0.2, 30 and 300 tried;
# P95 below LRU on 6, 6 and 7 of 8 seeds, fewer bytes on 4, 6 and 7).
RUNTIME_AGENTKV = AgentKvConfig(
    profile=replace(PROFILES["balanced"], name="service", eta=300.0),
    cost=RUNTIME_COST,
    gap=GapConfig(short_gap_s=0.1, return_quantile=0.1),
    predictor=PredictorConfig(prior_median_s=0.5, prior_weight=1),
)
# C_recomp of eq. 3-4 for a page: re-prefilling its tokens on the engine. Measured with the
# small real model on the 2-core reference machine (benchmarks/bench_ttft.py: 1,041 tokens,
# 45 MiB of KV, prefilled in 5.9 s): 0.13 s per MB of full-precision KV, scaled by the
# type's recompute weight (Table 1) as in the simulator.
RUNTIME_PREFILL_S_PER_MB = 0.13


def set_type(view: PageView, state_type: StateType, length: int) -> None:
    """Give a page of ``length`` KV bytes its type and the Table 1 priors that come with it
    (at admission, and when an event changes the type): reuse prior, correctness weight,
    and C_recomp, the seconds the engine would need to re-prefill it."""
    d = TYPE_DEFAULTS[state_type]
    view.state_type, view.reuse_prob = state_type, d.reuse_prob
    view.correctness_weight = d.correctness_weight
    view.recompute_cost_s = length / 1e6 * d.recompute_weight * RUNTIME_PREFILL_S_PER_MB
