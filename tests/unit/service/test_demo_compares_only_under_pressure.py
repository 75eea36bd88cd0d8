"""`agentkv demo` states a P95 ratio only when the two runs could differ: some page read
again, and some read not served straight from HBM. Replays of the public traces at the
demo's sizes fit in HBM (every read a hit) or read nothing again (Azure), and used to
print 'P95 ratio 1.00 ... cannot tell the two apart' as if they had been compared."""

from __future__ import annotations

from agentkv_cluster.cli.demo import pressed


def _fig(accesses: int, hit: float) -> dict:
    return {"accesses": accesses, "byte_hit_pct": hit}


def test_no_read_again_compares_nothing() -> None:
    assert not pressed({"agentkv": _fig(0, 0.0), "lru": _fig(0, 0.0)})


def test_every_read_from_hbm_under_both_policies_compares_nothing() -> None:
    assert not pressed({"agentkv": _fig(40, 100.0), "lru": _fig(40, 100.0)})


def test_a_miss_under_either_policy_is_a_comparison() -> None:
    assert pressed({"agentkv": _fig(40, 100.0), "lru": _fig(40, 62.5)})
    assert pressed({"agentkv": _fig(40, 90.0), "lru": _fig(40, 100.0)})
