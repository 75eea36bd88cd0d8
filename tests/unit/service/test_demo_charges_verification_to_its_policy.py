"""The demo's figures charge a lossy restore's verification to the policy that caused it
(tests/unit/service/).

No test looked at how the workload turns the service's ``complete_load`` reply into an
access: leaving the verification delay out of a page's delay, the verification fetch out
of the bytes moved, reporting inexact pages as exact, or not calling ``complete_load`` at
all passed the unit suite. The session client here replays the documented replies
(docs/protocol.md: ``prepare_load`` pages with ``delay_ms``; ``complete_load`` pages with
``exact``, ``verify_ms``, ``verify_bytes``); the workload code under test is real."""

from __future__ import annotations

from agentkv_cluster.api.workload import Results, WorkloadSpec, _Episode, _resume, summarize


class _Replies:
    """A session whose three pages come back: from HBM; restored lossy and verified
    (its FULL reference fetched in 7 ms); restored lossy with no reference (inexact)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare_load(self, keys):
        self.calls.append("prepare_load")
        return {"load_id": 1, "pages": [
            {"key": k, "source": s, "delay_ms": d, "hidden_ms": 0.0, "exact": e, "codec": c}
            for k, (s, d, e, c) in zip(keys, [("hbm", 0.0, True, "FULL"),
                                              ("host", 3.0, False, "INT8"),
                                              ("host", 2.0, False, "INT4")])]}

    def complete_load(self, load_id):
        self.calls.append("complete_load")
        return {"pages": [
            {"key": b"k0", "data": b"", "exact": True, "verify_ms": 0.0, "verify_bytes": 0},
            {"key": b"k1", "data": b"", "exact": True, "verify_ms": 7.0, "verify_bytes": 4096},
            {"key": b"k2", "data": b"", "exact": False, "verify_ms": 0.0, "verify_bytes": 0}]}

    def release(self, keys):
        self.calls.append("release")
        return {"released": len(keys)}


def _resumed() -> tuple[_Replies, Results]:
    ep = _Episode(WorkloadSpec(sessions=1, turns=1, seed=1), 0, "agentkv0")
    for pid in range(3):
        ep.live[pid], ep.sizes[pid] = f"k{pid}".encode(), 4096
    sc, results = _Replies(), Results()
    _resume(sc, ep, results)  # type: ignore[arg-type]
    return sc, results


def test_a_resume_completes_its_load_and_charges_verification_delay() -> None:
    sc, results = _resumed()
    assert sc.calls == ["prepare_load", "complete_load", "release"]
    assert [a.delay_ms for a in results.accesses] == [0.0, 3.0 + 7.0, 2.0]
    assert [(a.exact, a.verified) for a in results.accesses] == [
        (True, False), (True, True), (False, False)]


def test_the_figures_count_verification_bytes_and_inexact_pages() -> None:
    _sc, results = _resumed()
    traffic = {"hbm": 8192, "host": 8192, "verify": 4096}
    figures = summarize(results, traffic, batches=1)
    assert figures["transfer_mb_per_batch"] == (8192 + 8192 + 4096) / 1e6
    assert figures["bytes_per_tier"]["verify"] == 4096
    assert round(figures["inexact_pct"], 6) == round(100 / 3, 6)
    assert round(figures["verified_pct"], 6) == round(100 / 3, 6)
