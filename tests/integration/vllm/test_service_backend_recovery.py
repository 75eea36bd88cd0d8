"""The connector's service backend after the service came back empty (a restart) and after
its tenant was erased: it saves the blocks again and restarts the session's task, so
restores resume. It used to trust what it had cached (blocks it had stored, tasks it had
started) for as long as vLLM ran: after either, no turn restored anything again and every
lifecycle hint was refused."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from agentkv_cluster.config import load_config
from agentkv_cluster.engines.vllm.backend import BackendUnavailable
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.engines.vllm.service import ServiceBackend
from agentkv_cluster.runtime.service import Service
from tests.integration.vllm.test_backend_contract import BS, TOKENS, _ids, _page
from tests.support.redis_proc import free_port

pytestmark = pytest.mark.integration


class Live:
    """A service in this process on a fixed port, its token secret, and a backend for it."""

    def __init__(self) -> None:
        self.port, self.secret = free_port(), secrets.token_bytes(32)
        self.svc, self.workdir = self._start()
        self.backend = ServiceBackend(("127.0.0.1", self.port), timeout_s=5.0,
                                      retry_after_s=0.2)

    def _start(self) -> tuple[Service, Path]:
        workdir = Path(tempfile.mkdtemp(prefix="agentkv-vllm-recovery-"))
        cfg = load_config(env={}, overrides={
            "api": {"port": self.port},
            "hbm": {"page_bytes": 1 << 16, "num_pages": 64},
            "pool": {"pool_bytes": 4 << 20, "slot_bytes": 1 << 16,
                     "nvme_dir": str(workdir / "nv")},
        })
        return Service(cfg, workdir=workdir, token_secret=self.secret).start(local=True), workdir

    def restart_empty(self) -> None:
        """The service stops and another starts on the same address, holding nothing."""
        self._stop()
        self.svc, self.workdir = self._start()

    def _stop(self) -> None:
        self.svc.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        self.backend.close()
        self._stop()


@pytest.fixture
def live():
    env = Live()
    yield env
    env.close()


def _saved_again(backend: ServiceBackend, caller, ident, page) -> None:
    """What the worker does for a finished block: save it unless the service holds it."""
    if not backend.contains(caller, ident):
        backend.put(caller, ident, page)


def _one_block_saved(live: Live, session: str, seed: int):
    """acme's ``session`` has started its task (a model call) and saved one block."""
    backend = live.backend
    caller = backend.resolve(live.svc.token("acme"), session)
    ident = _ids(TOKENS, "acme", 1)[0]
    page = _page(ident, seed)
    backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))
    _saved_again(backend, caller, ident, page)
    return caller, ident, page


def test_a_restarted_service_gets_the_blocks_and_the_task_again(live) -> None:
    backend = live.backend
    caller, ident, page = _one_block_saved(live, "agent-r", 1)
    assert backend.contains(caller, ident)
    live.restart_empty()
    with pytest.raises(BackendUnavailable):  # the old connection is gone
        backend.get(caller, ident)
    time.sleep(0.3)  # retry_after_s
    assert not backend.contains(caller, ident)  # nothing assumed held any more
    _saved_again(backend, caller, ident, page)
    assert backend.get(caller, ident) == page
    backend.event(caller, HintEvent(kind=HintKind.MODEL_CALL))  # its task restarted


def test_a_tenant_made_anew_after_its_erasure_is_saved_again(live) -> None:
    backend = live.backend
    _, ident, page = _one_block_saved(live, "agent-e", 2)  # a token from before the erasure
    assert live.svc.erase_tenant("acme").failed_tiers == ()
    time.sleep(0.01)
    new = backend.resolve(live.svc.token("acme"), "agent-e")  # a token after the erasure
    assert backend.lookup(new, [ident]) == 0  # nothing of the old tenant
    _saved_again(backend, new, ident, page)
    assert backend.lookup(new, [ident]) == 1 and backend.get(new, ident) == page
    backend.event(new, HintEvent(kind=HintKind.MODEL_CALL))


def test_the_cache_of_stored_blocks_is_bounded_and_forgetting_costs_only_a_save(live) -> None:
    """Long-running vLLM: the backend remembers at most max_cached_keys service keys (it
    used to keep one per token and block for as long as vLLM ran); a block it forgot is
    found again by lookup, and saving it again stores nothing twice."""
    backend = live.backend
    backend.max_cached_keys = 4
    caller = backend.resolve(live.svc.token("acme"), "agent-b")
    idents = _ids(list(range(2000, 2000 + 6 * BS)), "acme", 6)
    assert len(idents) == 6
    pages = [_page(ident, i) for i, ident in enumerate(idents)]
    for ident, page in zip(idents, pages):
        _saved_again(backend, caller, ident, page)
    assert len(backend._keys) == 4
    assert not backend.contains(caller, idents[0])  # the oldest went
    assert all(backend.contains(caller, ident) for ident in idents[2:])
    assert backend.get(caller, idents[0]) == pages[0]  # looked up again
    assert backend.lookup(caller, idents) == 6 and len(backend._keys) == 4
