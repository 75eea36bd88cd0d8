"""``agentkv demo`` refuses, before it starts anything, a workload the machine cannot hold.

``--sessions 100000`` asked for a 376 GiB HBM arena (35 % of a 1 TiB working set) and
a connection per session; the demo ran past a minute without finishing or failing."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from agentkv_cluster.api.workload import WorkloadSpec
from agentkv_cluster.cli import CliError
from agentkv_cluster.cli._demo_fits import Machine, check_fits, demo_needs, hbm_capacity

GIB = 1 << 30
ROOMY = Machine(mem_available=24 * GIB, open_files=1 << 20)


def _fits(sessions: int, machine: Machine) -> bool:
    spec, cap = hbm_capacity(WorkloadSpec(sessions=sessions), 0.35)
    try:
        check_fits(spec, cap, machine, 0.35)
    except CliError:
        return False
    return True


def test_the_default_workload_fits_a_ci_machine():
    assert _fits(8, ROOMY)
    assert _fits(100, ROOMY)


def test_a_huge_demo_is_refused_with_the_largest_count_that_fits():
    spec, cap = hbm_capacity(WorkloadSpec(sessions=100_000), 0.35)
    with pytest.raises(CliError, match=r"--sessions 100000 needs .* GiB .*at most --sessions (\d+) fits") as exc:
        check_fits(spec, cap, ROOMY, 0.35)
    largest = int(str(exc.value).rsplit("--sessions ", 1)[1].split()[0])
    assert _fits(largest, ROOMY) and not _fits(largest + 1, ROOMY)
    need, _ = demo_needs(*hbm_capacity(WorkloadSpec(sessions=largest), 0.35))
    assert need <= ROOMY.mem_available


def test_open_files_bound_the_sessions_too():
    few_files = replace(ROOMY, open_files=1024)
    with pytest.raises(CliError, match="open files, the limit is 1024"):
        check_fits(*hbm_capacity(WorkloadSpec(sessions=1000), 0.35), few_files, 0.35)
    assert _fits(100, few_files)


def test_the_cli_refuses_at_once_with_status_2():
    env = dict(os.environ, RAY_ADDRESS="local")
    done = subprocess.run([sys.executable, "-m", "agentkv_cluster.cli", "demo", "--sessions",
                           "100000"], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--sessions 100000 needs" in done.stderr and "at most --sessions" in done.stderr


def test_the_warm_up_runs_a_few_synthetic_sessions_at_once(monkeypatch):
    """600 quick sessions at once, unstaggered, pinned more than the HBM budget holds and
    were refused (bad_args) in the warm-up; its quick round runs at most WARMUP_SESSIONS,
    the default workload's count, so the default demo's warm-up is unchanged."""
    from agentkv_cluster.api import workload
    from agentkv_cluster.api.workload import Results
    from agentkv_cluster.cli import demo

    ran: list[tuple[str, int]] = []

    def run_workload(_connect, spec, run, *_a):
        ran.append((run, spec.sessions))
        return Results()

    class _Service:
        hbm_capacity = 1 << 30

        def use_policy(self, _policy: str) -> None:
            pass

        def client(self, _tenant: str) -> None:
            return None

    monkeypatch.setattr(workload, "run_workload", run_workload)
    for sessions, quick in ((600, demo.WARMUP_SESSIONS), (8, 8), (3, 3)):
        ran.clear()
        demo._warm_up(_Service(), WorkloadSpec(sessions=sessions))
        assert ran == [("warmup", quick), ("train", sessions)]
