"""Scheduler side of the connector: bookkeeping only, no KV bytes.

Per request: parse the hints, resolve the caller (tenant from the token), forward the
lifecycle events, find the longest prefix of the prompt's blocks the backend holds,
remember which vLLM blocks the restored tokens land in, and plan, each step, the blocks
that become full (computed) and must be saved. A remote lookup (service backend) runs
on a background thread; until it answers, vLLM is told "not yet" (``None``) and keeps
scheduling other requests; a lookup that takes longer than ``lookup_timeout_s`` counts
as a miss. Nothing here waits on the store.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentkv_cluster.engines.vllm.backend import (
    BackendUnavailable,
    BlockBackend,
    Caller,
    CallerRefused,
    ConnectorCounters,
)
from agentkv_cluster.engines.vllm.blocks import EngineVersions, block_identity, chain_hashes
from agentkv_cluster.engines.vllm.hints import KEY, AgentHints, HintError, parse_hints
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.keyring import PUBLIC_NAMESPACE

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Req:
    request: Any  # vllm.v1.request.Request (live: its token list grows as it decodes)
    hints: AgentHints | None = None  # None: the hints did not parse
    caller: Caller | None = None  # set once admitted (token verified)
    publish: bool = False
    errors: list[str] = field(default_factory=list)
    lookup: Future | None = None
    lookup_started: float = 0.0
    matched: list[PageIdentity] = field(default_factory=list)  # held by the backend
    local_tokens: int = 0  # vLLM's own prefix-cache hit (block aligned)
    load_tokens: int = 0
    loads: list[BlockOp] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks [0, saved_upto) are held or planned
    hashes: list[bytes] = field(default_factory=list)


class SchedulerSide:
    def __init__(self, backend: BlockBackend, versions: EngineVersions, block_size: int,
                 counters: ConnectorCounters, *, remote: bool, lookup_timeout_s: float) -> None:
        self.backend = backend
        self.versions = versions
        self.block_size = block_size
        self.counters = counters
        self.lookup_timeout_s = lookup_timeout_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentkv-lookup") if remote else None
        self._reqs: dict[str, _Req] = {}

    # -- per request ---------------------------------------------------------------------
    def _state(self, request: Any) -> _Req:
        st = self._reqs.get(request.request_id)
        if st is not None:
            return st
        st = self._reqs[request.request_id] = _Req(request=request)
        try:
            hints = parse_hints(request.kv_transfer_params)
        except HintError as exc:
            self.counters.add(hint_errors=1)
            st.errors.append(f"bad hints: {exc}")
            log.warning("request %s: %s; served without AgentKV", request.request_id, exc)
            return st
        st.hints = hints
        return st

    def _admit(self, st: _Req) -> None:
        """Verify the caller and forward the events (on the lookup thread when remote)."""
        hints = st.hints
        assert hints is not None
        try:
            st.caller = self.backend.resolve(hints.token, hints.session)
        except CallerRefused as exc:
            self.counters.add(hint_errors=1)
            st.errors.append(str(exc))
            return
        except BackendUnavailable as exc:
            self._unavailable(st, "resolve", exc)
            return
        st.publish = hints.publish and st.caller.is_admin
        if hints.publish and not st.caller.is_admin:
            st.errors.append("publish needs an admin token; kept in the tenant's namespace")
        for event in hints.events:
            try:
                self.backend.event(st.caller, event)
            except (BackendUnavailable, CallerRefused, ValueError) as exc:
                st.errors.append(f"event {event.kind.value}: {exc}")

    def _unavailable(self, st: _Req, what: str, exc: Exception) -> None:
        self.counters.add(backend_errors=1)
        st.errors.append(f"AgentKV backend unavailable ({what}); recomputed")
        log.warning("AgentKV backend unavailable during %s: %s; recomputing", what, exc)

    def _identities(self, st: _Req, n_blocks: int, namespace: str) -> list[PageIdentity]:
        req = st.request
        if len(st.hashes) < n_blocks:
            salt = f"{getattr(req, 'lora_request', None) or ''}|{getattr(req, 'cache_salt', '')}"
            st.hashes = chain_hashes(req.all_token_ids[:n_blocks * self.block_size],
                                     self.block_size, salt)
        adapter = str(getattr(getattr(req, "lora_request", None), "lora_name", "") or "")
        return [block_identity(self.versions, namespace=namespace, adapter=adapter, chain=h,
                               index=i, block_size=self.block_size)
                for i, h in enumerate(st.hashes[:n_blocks])]

    def _match(self, caller: Caller, st: _Req, n_blocks: int) -> list[PageIdentity]:
        """Longest run of blocks held, each in the tenant's namespace or (opt-in) PUBLIC."""
        per_ns = {ns: self._identities(st, n_blocks, ns) for ns in caller.read_namespaces()}
        matched: list[PageIdentity] = []
        while len(matched) < n_blocks:
            step = 0
            for ids in per_ns.values():
                step = self.backend.lookup(caller, ids[len(matched):])
                if step:
                    matched.extend(ids[len(matched):len(matched) + step])
                    break
            if not step:
                break
        return matched

    # -- vLLM calls ----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        try:
            return self._matched(request, num_computed_tokens)
        except Exception:  # never into vLLM's scheduler: the request is computed as usual
            log.exception("AgentKV: lookup for %s failed; recomputing", request.request_id)
            st = self._reqs.get(request.request_id)
            if st is not None:
                st.caller, st.matched = None, []
                st.errors.append("internal error in the AgentKV lookup; recomputed")
            return 0, False

    def _matched(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        st = self._state(request)
        if st.hints is None:
            return 0, False
        st.local_tokens = num_computed_tokens
        prompt = len(request.prompt_token_ids or ())
        n_blocks = max(0, (prompt - 1) // self.block_size)  # vLLM computes >= 1 token itself
        wanted = n_blocks * self.block_size > num_computed_tokens
        if self._pool is None:
            if st.caller is None and st.lookup_started == 0.0:
                st.lookup_started = time.monotonic()
                self._admit(st)
            if st.caller is None or not wanted:
                return 0, False
            st.matched = self._lookup_now(st, n_blocks)
        else:  # remote: admission and lookup on the lookup thread, never in this one
            if st.lookup is None:
                st.lookup = self._pool.submit(self._admit_and_lookup, st, n_blocks, wanted)
                st.lookup_started = time.monotonic()
            if not wanted:
                return 0, False  # admission (events, caller for saves) completes meanwhile
            if not st.lookup.done():
                if time.monotonic() - st.lookup_started < self.lookup_timeout_s:
                    return None, False  # ask again next step; vLLM schedules the others
                st.errors.append("AgentKV lookup timed out; recomputed")
                self.counters.add(backend_errors=1)
                st.matched = []
            else:
                st.matched = st.lookup.result()
        self.counters.add(lookups=1)
        tokens = len(st.matched) * self.block_size
        new = max(0, tokens - num_computed_tokens)
        self.counters.add(matched_tokens=new)
        return new, False

    def _admit_and_lookup(self, st: _Req, n_blocks: int, wanted: bool) -> list[PageIdentity]:
        self._admit(st)
        if st.caller is None or not wanted:
            return []
        return self._lookup_now(st, n_blocks)

    def _lookup_now(self, st: _Req, n_blocks: int) -> list[PageIdentity]:
        assert st.caller is not None
        try:
            return self._match(st.caller, st, n_blocks)
        except BackendUnavailable as exc:
            self._unavailable(st, "lookup", exc)
        except CallerRefused as exc:
            st.errors.append(str(exc))
        return []

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int
                                 ) -> None:
        st = self._reqs.get(request.request_id)
        if st is None or st.caller is None or num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        first = st.local_tokens // self.block_size
        last = (st.local_tokens + num_external_tokens) // self.block_size
        st.loads = [BlockOp(st.matched[i], block_ids[i]) for i in range(first, last)]
        st.load_tokens = num_external_tokens

    def build_connector_meta(self, so: Any) -> AgentKVConnectorMetadata:
        meta = AgentKVConnectorMetadata()
        for new in so.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            st.saved_upto = len(st.matched)  # those are held already
            if st.caller is None:
                continue
            self._plan(meta, st, new.req_id, new.num_computed_tokens,
                       so.num_scheduled_tokens.get(new.req_id, 0))
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            if st.caller is None:
                continue
            self._plan(meta, st, req_id, cached.num_computed_tokens[i],
                       so.num_scheduled_tokens.get(req_id, 0))
        take_events = getattr(self.backend, "take_events", None)  # embedded: to the worker
        if take_events is not None:
            meta.events = take_events()
        return meta

    def load_failed(self, failed: dict[str, int]) -> None:
        """The worker could not restore these tokens; vLLM recomputes them."""
        for req_id, tokens in failed.items():
            st = self._reqs.get(req_id)
            if st is not None:
                st.load_tokens = max(0, st.load_tokens - tokens)
                st.errors.append(f"{tokens} tokens could not be restored; recomputed")

    def forget(self, dropped: set[bytes]) -> None:
        forget = getattr(self.backend, "forget", None)
        if forget is not None and dropped:
            forget(dropped)

    def _plan(self, meta: AgentKVConnectorMetadata, st: _Req, req_id: str, computed: int,
              scheduled: int) -> None:
        try:
            self._plan_one(meta, st, req_id, computed, scheduled)
        except Exception:  # never into vLLM's scheduler: this request just is not saved
            log.exception("AgentKV: planning saves for %s failed", req_id)
            st.caller = None

    def _plan_one(self, meta: AgentKVConnectorMetadata, st: _Req, req_id: str, computed: int,
                  scheduled: int) -> None:
        assert st.caller is not None
        loads, st.loads = tuple(st.loads), []
        full = min((computed + scheduled) // self.block_size, len(st.block_ids),
                   len(st.request.all_token_ids) // self.block_size)
        saves: tuple[BlockOp, ...] = ()
        if full > st.saved_upto:
            ns = PUBLIC_NAMESPACE if st.publish else st.caller.tenant
            ids = self._identities(st, full, ns)
            saves = tuple(BlockOp(ids[b], st.block_ids[b]) for b in range(st.saved_upto, full))
            st.saved_upto = full
            expect = getattr(self.backend, "expect", None)  # the embedded directory's mirror
            if expect is not None:
                for op in saves:
                    expect(op.identity)
        if loads or saves:
            meta.requests.append(RequestOps(req_id, st.caller, loads, saves))

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is None:
            return False, None
        report: dict[str, Any] = {"restored_tokens": st.load_tokens,
                                  "tenant": st.caller.tenant if st.caller else None}
        if st.errors:
            report["errors"] = st.errors
        return False, {KEY: report}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
