"""Fixtures shared by every suite: the shared/ folder, a real redis-server, GPU marks."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.support.redis_proc import RedisProcess

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


SHM = Path("/dev/shm")


@pytest.fixture(scope="session", autouse=True)
def _remove_pool_segments_left_by_killed_actors():
    """Fault tests SIGKILL pool actors and whole Ray nodes, which cannot unlink their
    /dev/shm segments; remove only the segments that appeared during this session and
    that no live process maps (a pytest session running beside this one keeps its own)."""
    before = set(SHM.glob("akv-*")) if SHM.is_dir() else set()
    yield
    if SHM.is_dir():
        in_use = _mapped_shm()
        for path in set(SHM.glob("akv-*")) - before - in_use:
            if not _another_live_sessions(path):
                path.unlink(missing_ok=True)


def _another_live_sessions(path: Path) -> bool:
    """A ``pool_name`` segment of another pytest process that is still running: it may be
    between a creator that closed it and the next attach, mapped by no one for a moment
    (seen with two sessions at once); its own fixture unlinks it."""
    parts = path.name.split("-")
    if len(parts) < 4 or parts[1] != "test" or not parts[2].isdigit():
        return False
    pid = int(parts[2])
    return pid != os.getpid() and Path(f"/proc/{pid}").exists()


def _mapped_shm() -> set[Path]:
    """/dev/shm files some live process has mapped (from every readable /proc/PID/maps)."""
    found: set[Path] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        for line in text.splitlines():
            at = line.find("/dev/shm/akv-")
            if at >= 0:
                found.add(Path(line[at:].split(" (deleted)")[0]))
    return found


@pytest.fixture
def pool_name():
    """A fresh /dev/shm segment name for a host pool, unlinked after the test."""
    name = f"akv-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    (SHM / name).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (read-only in CI). Tests never write there."""
    if not SHARED.is_dir():
        pytest.skip(f"../shared is absent ({SHARED}); traces and schemas live there")
    return SHARED


@pytest.fixture(scope="session")
def traces_dir(shared_dir: Path) -> Path:
    path = shared_dir / "traces"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    return path


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server on a free loopback port, shared by a whole test session."""
    server = RedisProcess().start()
    yield server
    server.close()


@pytest.fixture
def fresh_redis():
    """A private redis-server for tests that kill, restart or reconfigure it."""
    server = RedisProcess().start()
    yield server
    server.close()
