"""The interface both connector backends implement, and what they share.

A backend stores block pages by `PageIdentity` for an authenticated ``Caller``:

- `EmbeddedBackend` (``embedded.py``, ``directory.py``): host pool + NVMe shard inside the vLLM process,
  one node, no Ray; tokens are verified with the service's token secret.
- `ServiceBackend` (``service.py``): the AgentKV service through its wire client; the
  service verifies the token, keeps tenants apart and runs the lifecycle policy.

Failures of the store itself raise ``BackendUnavailable``: the connector then recomputes
(a logged warning and a metric), it never fails or holds a request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentkv_cluster.engines.vllm.hints import HintEvent
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.keyring import PUBLIC_NAMESPACE

__all__ = ["PUBLIC_NAMESPACE", "BackendUnavailable", "BlockBackend", "Caller", "CallerRefused",
           "ConnectorCounters"]


class BackendUnavailable(Exception):
    """The store cannot be reached or failed; the request recomputes instead."""


class CallerRefused(ValueError):
    """The request's token is missing, invalid or expired (an error in the response)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Caller:
    """Who a request acts for: the tenant from its verified token, never a request field."""

    tenant: str
    session: str  # the agent session of the hints, or a per-tenant default
    token: str | None = None
    branch: str = ""  # the session's branch the request works on ("": its trunk)
    public_read: bool = False  # the tenant opted in to the PUBLIC namespace
    is_admin: bool = False
    can_publish: bool = False  # the token's publish role (the service also wants a grant)
    issued: float = 0.0  # when its token was issued (token-less: resolved); erasures void it

    def read_namespaces(self) -> tuple[str, ...]:
        """Where this caller's lookups may match, own namespace first."""
        return (self.tenant, PUBLIC_NAMESPACE) if self.public_read else (self.tenant,)


class BlockBackend(Protocol):
    name: str

    def resolve(self, token: str | None, session: str | None) -> Caller:
        """Authenticate ``token``; ``CallerRefused`` or ``BackendUnavailable``."""

    def lookup(self, caller: Caller, identities: Sequence[PageIdentity]) -> int:
        """Length of the leading run of ``identities`` held (each names its namespace)."""

    def get(self, caller: Caller, identity: PageIdentity) -> bytes | None:
        """The block page, or None when it is gone (evicted, retired)."""

    def put(self, caller: Caller, identity: PageIdentity, data: bytes) -> None:
        """Keep a block page; writing an identity already held is a no-op."""

    def contains(self, caller: Caller, identity: PageIdentity) -> bool: ...

    def event(self, caller: Caller, event: HintEvent) -> None:
        """A lifecycle hint for the caller's session."""

    def close(self) -> None: ...


@dataclass(slots=True)
class ConnectorCounters:
    """What the connector did, per process (read by tests, the benchmark and logs)."""

    lookups: int = 0
    matched_tokens: int = 0
    restored_tokens: int = 0  # loaded into vLLM's KV cache, not recomputed
    load_failures: int = 0  # blocks that failed to load: recomputed
    saved_blocks: int = 0
    save_failures: int = 0
    save_dropped: int = 0  # the save queue was full: skipped, never waited for
    backend_errors: int = 0  # BackendUnavailable seen (each logged)
    rejected_blocks: int = 0  # identity or checksum mismatch: never loaded
    hint_errors: int = 0
    hints_received: int = 0  # standalone hints (the hint socket), not carried by a request
    prefetched_blocks: int = 0  # promoted to the host pool before a predicted tool return
    # where the time goes (microseconds, summed): what vLLM's step waited for, and the
    # connector's work off the step (loader and writer threads, lookups)
    step_wait_us: int = 0  # inside start_load_kv + wait_for_save, on vLLM's step
    load_us: int = 0  # reading, checking and scattering restored blocks
    async_loads: int = 0  # requests whose blocks were loaded off the step (get_finished)
    gather_us: int = 0  # copying finished blocks out of vLLM's cache (on the step)
    write_us: int = 0  # sealing and writing saved blocks (writer thread)
    lookup_us: int = 0  # scheduler-side lookups
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {name: getattr(self, name) for name in self.__slots__ if name != "lock"}
