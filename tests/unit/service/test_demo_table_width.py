"""`agentkv demo` prints its table whole where stdout is not a terminal (no Ray needed)."""

from __future__ import annotations

from typing import Any

import pytest

from agentkv_cluster.cli import demo, main


def _figures(hbm: float, host: float, nvme: float) -> dict[str, Any]:
    return {"p50_ms": 58.06, "p95_ms": 436.33, "p99_ms": 918.52, "byte_hit_pct": 29.07,
            "transfer_mb_per_batch": 13.21, "hidden_pct": 0.0, "verified_pct": 0.0,
            "inexact_pct": 0.0, "accesses": 72, "errors": 0,
            "bytes_per_tier": {"hbm": hbm, "host": host, "nvme": nvme}}


def test_the_demo_table_keeps_every_header_and_each_policy_on_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The columns a log reader compares: no header cut short ("MB/sessi…") and each
    policy's bytes per tier on its own row line, however narrow the output is."""
    payload = {"policies": {"agentkv": _figures(135.1e6, 99.1e6, 12.3e6),
                            "lru": _figures(205.8e6, 111.1e6, 104.4e6)},
               "p95_ratio": None, "config": {}}
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(demo, "check_fits", lambda *a, **k: None)
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: payload)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "P50 ms" in line)
    for label in ("policy", "P50 ms", "P95 ms", "P99 ms", "byte hit %", "MB/session",
                  "hidden %", "verified %", "inexact %", "bytes per tier (MB)"):
        assert label in header, (label, out)
    assert "…" not in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 2, out
    assert "hbm 135.1, host 99.1, nvme 12.3" in rows[0]
    assert "hbm 205.8, host 111.1, nvme 104.4" in rows[1]
