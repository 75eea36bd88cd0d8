"""``agentkv demo --turns 100000`` was refused with a message that blamed ``--sessions``
("no session count fits"): one session of that many turns alone is too large, so the
refusal names ``--turns`` and the most turns that fit."""

from __future__ import annotations

import pytest

from agentkv_cluster.api.workload import WorkloadSpec
from agentkv_cluster.cli import CliError, main
from agentkv_cluster.cli import demo as demo_cli
from agentkv_cluster.cli._demo_fits import Machine, check_fits, hbm_capacity

GIB = 1 << 30
ROOMY = Machine(mem_available=24 * GIB, open_files=1 << 20)


def _fits(sessions: int, turns: int) -> bool:
    return ROOMY.holds(*hbm_capacity(WorkloadSpec(sessions=sessions, turns=turns), 0.35))


def test_too_many_turns_names_turns_and_the_most_that_fit() -> None:
    spec, cap = hbm_capacity(WorkloadSpec(sessions=8, turns=100_000), 0.35)
    with pytest.raises(CliError) as info:
        check_fits(spec, cap, ROOMY, 0.35)
    text = str(info.value)
    assert text.startswith("--turns 100000 needs ") and "--sessions 8 needs" not in text
    assert text.rsplit("; ", 1)[1].startswith("at most --turns ")
    most = int(text.rsplit("at most --turns ", 1)[1].split()[0])
    assert text.endswith(f"at most --turns {most} fits with --sessions 8")
    assert _fits(8, most) and not _fits(8, most + 1)


def test_too_many_sessions_still_names_sessions() -> None:
    spec, cap = hbm_capacity(WorkloadSpec(sessions=100_000, turns=3), 0.35)
    with pytest.raises(CliError, match=r"^--sessions 100000 needs .*at most --sessions \d+ fits$"):
        check_fits(spec, cap, ROOMY, 0.35)


def test_the_cli_names_turns(monkeypatch, capsys) -> None:
    monkeypatch.setattr(demo_cli, "this_machine", lambda: ROOMY)
    assert main(["demo", "--turns", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentkv demo: error: --turns 100000 needs ") and err.count("\n") == 1
    assert "--sessions 8 needs" not in err and "no session count fits" not in err
