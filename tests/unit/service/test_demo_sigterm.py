"""`agentkv demo` stopped by SIGTERM (`timeout`, a cancelled CI job, a stopped pod) still
runs its cleanup: the host pool in /dev/shm, the temporary folder and the local Ray go
with it (no Ray needed here: the run is replaced by one that is sent SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, signal, sys, time
from agentkv_cluster.cli import demo, main

def run_demo(*args, **kwargs):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    finally:
        print("cleanup ran", flush=True)
    return {}

demo.check_fits = lambda *a, **k: None
demo.run_demo = run_demo
sys.exit(main(["demo"]))
"""


def test_sigterm_unwinds_the_demo_through_its_cleanup() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert "cleanup ran" in proc.stdout
    assert "agentkv demo: interrupted" in proc.stderr
