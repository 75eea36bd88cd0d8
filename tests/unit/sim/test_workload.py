"""The Table-3 generator: ranges, mix, common random numbers, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.sim.config import MB, SimConfig, SimConfigError, WorkloadConfig
from agentkv_cluster.sim.workload import TYPE_ORDER, synthetic_workload


def small(**kw) -> SimConfig:
    return SimConfig(workload=WorkloadConfig(batches=400), **kw)


def test_sizes_mix_and_capacity_follow_table_3():
    wl = synthetic_workload(small())
    sizes = np.concatenate([b.sizes for b in wl]) / MB
    assert sizes.min() >= 8.0 and sizes.max() <= 220.0
    types = np.concatenate([b.types for b in wl])
    assert types.size == 400 * 32
    cfg = small()
    for i, st in enumerate(TYPE_ORDER):
        share = float((types == i).mean())
        assert share == pytest.approx(cfg.workload.types[st].mix, abs=0.015), st
    for b in wl:
        assert b.capacity_bytes == int(np.floor(0.35 * b.sizes.sum()))


def test_reads_follow_creation_and_reused_pages_end_at_their_read():
    wl = synthetic_workload(small())
    prefix = TYPE_ORDER.index(StateType.FIXED_PREFIX)
    for b in list(wl)[:50]:
        assert (b.created[b.types == prefix] == 0.0).all()
        for i in range(b.n_pages):
            reads = b.access_times[i]
            assert len(reads) <= 1
            if len(reads):
                assert reads[0] > b.created[i]
                assert b.eol[i] == reads[0]
            else:
                assert b.created[i] <= b.eol[i]


def test_reuse_rate_matches_the_type_table():
    cfg = SimConfig(workload=WorkloadConfig(batches=1500))
    wl = synthetic_workload(cfg)
    for i, st in enumerate(TYPE_ORDER):
        reused = [len(b.access_times[j]) for b in wl for j in range(b.n_pages) if b.types[j] == i]
        assert np.mean(reused) == pytest.approx(cfg.workload.types[st].reuse_prob, abs=0.03), st


def test_each_noise_level_draws_fresh_errors_on_the_same_pages():
    a = synthetic_workload(small(noise=0.2))
    b = synthetic_workload(small(noise=0.8))
    again = synthetic_workload(small(noise=0.2))
    za, zb = [], []
    for x, y, z in zip(list(a)[:40], list(b)[:40], list(again)[:40]):
        # the pages, their gaps and jitter are common to every level
        assert np.array_equal(x.sizes, y.sizes) and np.array_equal(x.created, y.created)
        assert np.array_equal(x.jitter_ms, y.jitter_ms)
        for i in range(x.n_pages):
            assert np.array_equal(x.access_times[i], y.access_times[i])
            assert np.array_equal(x.predicted_idle[i], z.predicted_idle[i])  # deterministic
            if len(x.access_times[i]):  # the true gap is known: z = log(pred/true) / sigma
                true_gap = x.access_times[i][0] - x.created[i]
                za.append(np.log(x.predicted_idle[i][0] / true_gap) / 0.2)
                zb.append(np.log(y.predicted_idle[i][0] / true_gap) / 0.8)
    za, zb = np.array(za), np.array(zb)
    assert za.size > 300
    # standard normal errors at both levels, but not one sample rescaled
    assert abs(za.std() - 1.0) < 0.1 and abs(zb.std() - 1.0) < 0.1
    assert abs(np.corrcoef(za, zb)[0, 1]) < 0.15


def test_same_seed_same_arrays_other_seed_differs():
    a, b, c = (synthetic_workload(SimConfig(seed=s, workload=WorkloadConfig(batches=5)))
               for s in (7, 7, 8))
    assert all(np.array_equal(x.sizes, y.sizes) and np.array_equal(x.jitter_ms, y.jitter_ms)
               for x, y in zip(a, b))
    assert not np.array_equal(a.batches[0].sizes, c.batches[0].sizes)


@pytest.mark.parametrize("kw, message", [
    ({"budget": 0.0}, "budget"), ({"budget": 1.5}, "budget"), ({"noise": -0.1}, "noise"),
    ({"seed": -1}, "seed"), ({"workload": WorkloadConfig(batches=0)}, "batches"),
    ({"workload": WorkloadConfig(size_min_mb=300.0)}, "size_min_mb"),
])
def test_invalid_parameters_are_rejected(kw, message):
    with pytest.raises(SimConfigError, match=message):
        SimConfig(**kw)


def test_config_dict_lists_every_type():
    d = SimConfig().to_dict()
    assert set(d["workload"]["types"]) == {t.name.lower() for t in StateType}
    assert d["link"]["bandwidth_gbps"] == 24.0 and d["link"]["fixed_overhead_ms"] == 1.2
    assert d["compression_ratio"] == 3.2
