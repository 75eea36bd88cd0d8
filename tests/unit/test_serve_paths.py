"""``agentkv serve``'s claim on its folders before Ray starts: one service per state and
NVMe directory, an NVMe directory it can use, and a quota the file system can hold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentkv_cluster.cli import CliError
from agentkv_cluster.cli._serve_paths import (
    LOCK_NAME,
    DirectoryInUse,
    ServeClaim,
    claim_local_paths,
    nvme_space_warning,
)
from agentkv_cluster.config import load_config

GiB, MiB = 1 << 30, 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def _cfg(**pool: object):
    return load_config(env={}, overrides={"pool": pool})


@pytest.mark.parametrize(("quota", "free", "held", "fits"), [
    (4 * GiB, 4 * GiB, 0, True),
    (4 * GiB, 3 * GiB, GiB, True),  # the shard files count: they are the tier's own bytes
    (4 * GiB, 6 * MiB, 0, False),
    (4 * GiB, 2 * GiB, GiB, False),
])
def test_nvme_space_warning_says_when_the_quota_does_not_fit(quota, free, held, fits) -> None:
    warning = nvme_space_warning(quota, free, held)
    if fits:
        assert warning is None
    else:
        assert warning is not None
        assert warning.startswith("--nvme-bytes 4.0 GiB does not fit")


def test_a_second_claim_on_the_state_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first, _ = claim_local_paths(_cfg(), tmp_path)
    try:
        with pytest.raises(DirectoryInUse) as err:
            claim_local_paths(_cfg(), tmp_path)
        assert err.value.flag == "--state-dir" and err.value.holder == str(os.getpid())
        assert f"--state-dir {tmp_path} is in use by another agentkv serve (pid " \
            f"{os.getpid()})" in str(err.value)
    finally:
        first.release()
    again, _ = claim_local_paths(_cfg(), tmp_path)  # released: free again
    again.release()


def test_two_state_dirs_on_one_nvme_dir_are_refused(tmp_path: Path) -> None:
    nvme = tmp_path / "nvme"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = claim_local_paths(_cfg(nvme_dir=str(nvme)), tmp_path / "a")
    try:
        with pytest.raises(DirectoryInUse, match=r"--nvme-dir .* is in use") as err:
            claim_local_paths(_cfg(nvme_dir=str(nvme)), tmp_path / "b")
        assert err.value.path == nvme
        # The refused claim let go of what it had taken (b's state lock):
        ServeClaim().lock("--state-dir", tmp_path / "b")
    finally:
        first.release()


def test_with_a_ray_address_the_nvme_dir_is_left_to_the_pool_nodes(tmp_path: Path) -> None:
    cfg = load_config(env={}, overrides={"ray": {"address": "10.0.0.1:6379"},
                                         "pool": {"nvme_dir": str(tmp_path / "afile")}})
    (tmp_path / "afile").write_text("")
    (tmp_path / "st").mkdir()
    claim, warning = claim_local_paths(cfg, tmp_path / "st")
    claim.release()
    assert warning is None


def test_nvme_dir_equal_to_state_dir_is_claimed_once(tmp_path: Path) -> None:
    claim, _ = claim_local_paths(_cfg(nvme_dir=str(tmp_path)), tmp_path)
    claim.release()


@pytest.mark.parametrize("make", ["file", "under_a_file"])
def test_an_nvme_dir_that_cannot_be_a_folder_is_a_one_line_error(tmp_path, make) -> None:
    (tmp_path / "afile").write_text("")
    nvme = tmp_path / "afile" if make == "file" else tmp_path / "afile" / "nvme"
    (tmp_path / "st").mkdir()
    with pytest.raises(CliError, match=r"--nvme-dir .*afile") as err:
        claim_local_paths(_cfg(nvme_dir=str(nvme)), tmp_path / "st")
    assert not isinstance(err.value, DirectoryInUse)
    ServeClaim().lock("--state-dir", tmp_path / "st")  # the state lock was let go


def test_a_quota_over_the_free_space_warns(tmp_path: Path) -> None:
    claim, warning = claim_local_paths(_cfg(nvme_bytes=1 << 60), tmp_path)
    claim.release()
    assert warning is not None and "does not fit" in warning
    claim, warning = claim_local_paths(_cfg(nvme_bytes=8 * MiB), tmp_path)  # 2 pages
    claim.release()
    assert warning is None


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path;"
            "from agentkv_cluster.cli._serve_paths import ServeClaim;"
            "ServeClaim().lock('--state-dir', Path(sys.argv[1])); print('held', flush=True);"
            "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse, match=f"pid {proc.pid}"):
            ServeClaim().lock("--state-dir", tmp_path)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    claim = ServeClaim()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops a dead holder's flock; retry briefly for its teardown
        try:
            claim.lock("--state-dir", tmp_path)
            break
        except DirectoryInUse:
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.05)
    claim.release()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_an_nvme_dir_on_a_read_only_file_system_is_a_one_line_error(tmp_path: Path) -> None:
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    (tmp_path / "st").mkdir()
    try:
        with pytest.raises(CliError, match=f"--nvme-dir {mnt}"):
            claim_local_paths(_cfg(nvme_dir=str(mnt)), tmp_path / "st")
        with pytest.raises(CliError, match=f"--nvme-dir {mnt / 'sub'}: Read-only"):
            claim_local_paths(_cfg(nvme_dir=str(mnt / "sub")), tmp_path / "st")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_file_system_without_flock_is_served_unguarded(tmp_path, monkeypatch) -> None:
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    claim, _ = claim_local_paths(_cfg(), tmp_path)  # no refusal, no traceback
    claim.release()
