"""The victim orders as every policy computed them before it kept them between calls:
a full sort of the resident records per call. The kept-order tests compare against
these, call by call.

Each takes the resident records in the policy's tracking order (``resident``: the
same dict order as the policy's, which the float sum of the conservative test
depends on) and returns every page id in victim order, pinned ones included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from agentkv_cluster.policy.agentkv import AgentKvPolicy
from agentkv_cluster.policy.base import PageView, remaining_idle_s
from agentkv_cluster.policy.baselines import ArcPolicy, SemanticPolicy
from agentkv_cluster.policy.columns import COLUMNAR_MIN_PAGES, lexsorted_ids
from agentkv_cluster.policy.value import PageColumns

Resident = Mapping[int, PageView]


def agentkv_conservative(policy: AgentKvPolicy, resident: Resident) -> bool:
    conf = [p.confidence for p in resident.values() if not p.pinned]
    return bool(conf) and sum(conf) / len(conf) < policy.config.predictor.confidence_threshold


def agentkv_key(policy: AgentKvPolicy, page: PageView, now: float, conservative: bool
                ) -> tuple[object, ...]:
    if conservative:
        return (page.last_access, page.page_id)
    return (not policy.risk.guard_demotion(page), policy.value_model.density(page, now),
            page.last_access, page.page_id)


def agentkv_order(policy: AgentKvPolicy, resident: Resident, now: float) -> list[int]:
    pages = list(resident.values())
    if agentkv_conservative(policy, resident):
        return [p.page_id for p in sorted(pages, key=lambda p: (p.last_access, p.page_id))]
    if len(pages) >= COLUMNAR_MIN_PAGES:
        cols = PageColumns.from_pages(pages)
        density = policy.value_model.densities(cols, now)
        rc = policy.risk.config
        protected = np.zeros(len(pages), dtype=np.bool_)
        if rc.enabled:
            high = (cols.correctness >= rc.protect_weight) | (cols.dependency > 0.0)
            protected = high & (cols.confidence < rc.low_confidence)
        order = np.lexsort((cols.page_ids, cols.last_access, density, protected))
        return cols.page_ids[order].tolist()
    return [p.page_id for p in sorted(pages, key=lambda p: agentkv_key(policy, p, now, False))]


def agentkv_admission(policy: AgentKvPolicy, resident: Resident, page: PageView, now: float,
                      not_before: float | None) -> Iterable[int]:
    """The pages ``admit_prefetch`` may displace, in the order it reads them."""
    conservative = agentkv_conservative(policy, resident)
    if not_before is None:
        mine = agentkv_key(policy, page, now, conservative)
        below = [p for p in resident.values()
                 if agentkv_key(policy, p, now, conservative) < mine]
    else:
        below = [p for p in resident.values()
                 if p.last_access + p.predicted_idle_s >= not_before]
    below.sort(key=lambda p: agentkv_key(policy, p, now, conservative))
    return [p.page_id for p in below]


def ttl_order(resident: Resident, now: float) -> list[int]:
    pages = list(resident.values())
    if len(pages) >= COLUMNAR_MIN_PAGES:
        ids = np.array([p.page_id for p in pages], dtype=np.int64)
        deadline = np.array([p.last_access + p.predicted_idle_s for p in pages])
        size = np.array([float(p.size_bytes) for p in pages])
        last = np.array([p.last_access for p in pages], dtype=np.float64)
        remaining = np.maximum(deadline - now, 0.0)
        return list(lexsorted_ids(ids, (ids, last, -remaining * size)))

    def key(p: PageView) -> tuple[float, float, int]:
        return (-remaining_idle_s(p, now) * p.size_bytes, p.last_access, p.page_id)

    return [p.page_id for p in sorted(pages, key=key)]


def semantic_order(policy: SemanticPolicy, resident: Resident) -> list[int]:
    pages = list(resident.values())
    if len(pages) >= COLUMNAR_MIN_PAGES:
        ids = np.array([p.page_id for p in pages], dtype=np.int64)
        priority = np.array([policy.priority(p) for p in pages])
        last = np.array([p.last_access for p in pages], dtype=np.float64)
        return list(lexsorted_ids(ids, (ids, last, priority)))
    return [p.page_id for p in sorted(
        pages, key=lambda p: (policy.priority(p), p.last_access, p.page_id))]


def arc_order(policy: ArcPolicy, resident: Resident) -> list[int]:
    """REPLACE repeated over lists built in full (unpinned pages only)."""
    sizes = policy._t1.items
    t1 = [pid for pid in sizes if not resident[pid].pinned]
    t2 = [pid for pid in policy._t2.items if not resident[pid].pinned]
    t1_bytes = policy._t1.bytes
    out: list[int] = []
    i = j = 0
    while i < len(t1) or j < len(t2):
        if i < len(t1) and (t1_bytes > policy.p or j >= len(t2)):
            t1_bytes -= sizes[t1[i]]
            out.append(t1[i])
            i += 1
        else:
            out.append(t2[j])
            j += 1
    return out
