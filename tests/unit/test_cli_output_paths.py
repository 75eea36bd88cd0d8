"""The output paths of ``simulate`` and ``demo`` (``--json``, ``--export-trace``,
``--out-dir``) are checked by a real create before the run: permission bits said yes to
root for ``/proc/x.json``, and the run failed only at its end, its results lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv_cluster.cli import CliError, check_writable_dir, check_writable_file, main
from agentkv_cluster.cli import simulate as simulate_cli

PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not (PROC / "self").is_dir(), reason="no procfs here")


@needs_proc
def test_a_folder_that_takes_no_new_file_is_refused() -> None:
    """/proc takes no new file, for root too (whose os.access passes it)."""
    with pytest.raises(CliError, match=r"^--json /proc/x.json: folder /proc is not writable "
                                       r"\(creating a file there fails: "):
        check_writable_file(PROC / "x.json", "--json")
    with pytest.raises(CliError, match=r"^--out-dir /proc/figs/a: /proc is not writable"):
        check_writable_dir(PROC / "figs" / "a", "--out-dir")


@needs_proc
def test_simulate_refuses_it_before_the_run(monkeypatch, capsys) -> None:
    ran: list[object] = []
    monkeypatch.setattr(simulate_cli, "_run_mode", lambda *a: ran.append(a) or {})
    assert main(["simulate", "--json", "/proc/x.json"]) == 2
    assert ran == []
    err = capsys.readouterr().err
    assert err.startswith("agentkv simulate: error: --json /proc/x.json: folder /proc is not "
                          "writable") and err.count("\n") == 1


def test_a_writable_folder_passes_and_keeps_nothing(tmp_path: Path) -> None:
    check_writable_file(tmp_path / "out.json", "--json")
    check_writable_dir(tmp_path / "figs" / "a", "--out-dir")
    existing = tmp_path / "old.json"
    existing.write_text("kept")
    check_writable_file(existing, "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    assert existing.read_text() == "kept"  # opened to check, not truncated
