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
from dataclasses import dataclass, field, replace
from typing import Any

from agentkv_cluster.engines.vllm.backend import (
    BackendUnavailable,
    BlockBackend,
    Caller,
    CallerRefused,
    ConnectorCounters,
)
from agentkv_cluster.engines.vllm.blocks import EngineVersions
from agentkv_cluster.engines.vllm.hints import (
    KEY,
    AgentHints,
    HintError,
    parse_hints,
)
from agentkv_cluster.engines.vllm.hintsock import HintSocket
from agentkv_cluster.engines.vllm.matching import PrefixMatcher
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.engines.vllm.retiring import CloseSender, RetireHold, retiring_for
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.keyring import PUBLIC_NAMESPACE

log = logging.getLogger(__name__)
CLOSE_FLUSH_S = 10.0  # at shutdown, how long the session closes not sent yet may take


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
    tail: PageIdentity | None = None  # a held partial block right after ``matched``
    local_tokens: int = 0  # vLLM's own prefix-cache hit (block aligned)
    load_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks [0, saved_upto) are held or planned
    resave_from: int = 0  # the first block neither held nor restored
    tail_saved: bool = False  # the partial last block of its final step is planned
    hashes: list[bytes] = field(default_factory=list)


class SchedulerSide:
    def __init__(self, backend: BlockBackend, versions: EngineVersions, block_size: int,
                 counters: ConnectorCounters, *, remote: bool, lookup_timeout_s: float,
                 async_load: bool = True, min_tail_tokens: int = 16,
                 hints: HintSocket | None = None) -> None:
        self.backend = backend
        self.block_size = block_size
        self.counters = counters
        self.lookup_timeout_s = lookup_timeout_s
        self.async_load = async_load
        self.min_tail_tokens = min_tail_tokens  # 0: tails are never saved
        self.hints = hints
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentkv-lookup") if remote else None
        self._reqs: dict[str, _Req] = {}
        self._ops: list[RequestOps] = []  # loads and releases for the next metadata
        self.matcher = PrefixMatcher(backend, versions, block_size)
        self.closes = retiring_for(backend, self._pool)  # task_end waits for in-flight work

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
        if self.closes is not None:
            self.closes.arrived(request.request_id, hints)
        return st

    def arrived(self, request: Any) -> None:
        """vLLM took the request (``on_new_request``): from now on it is in flight."""
        try:
            self._state(request)
        except Exception:  # never into vLLM's scheduler
            log.exception("AgentKV: reading the hints of %s failed", request.request_id)

    def _admit(self, st: _Req) -> None:
        """Verify the caller and forward the events (on the lookup thread when remote)."""
        hints = st.hints
        assert hints is not None
        try:
            st.caller = self.backend.resolve(hints.token, hints.session)
            if hints.branch:
                st.caller = replace(st.caller, branch=hints.branch)
        except CallerRefused as exc:
            self.counters.add(hint_errors=1)
            st.errors.append(str(exc))
            return
        except BackendUnavailable as exc:
            self._unavailable(st, "resolve", exc)
            return
        st.publish = hints.publish and st.caller.can_publish
        if hints.publish and not st.caller.can_publish:
            st.errors.append("publish needs a token with the publish role; kept in the "
                             "tenant's namespace")
        for event in hints.events:
            try:
                self.backend.event(st.caller, event)
            except (BackendUnavailable, CallerRefused, ValueError) as exc:
                st.errors.append(f"event {event.kind.value}: {exc}")

    def _unavailable(self, st: _Req, what: str, exc: Exception) -> None:
        self.counters.add(backend_errors=1)
        st.errors.append(f"AgentKV backend unavailable ({what}); recomputed")
        log.warning("AgentKV backend unavailable during %s: %s; recomputing", what, exc)

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
        wanted = (n_blocks * self.block_size > num_computed_tokens  # blocks past vLLM's hit
                  or bool(self.min_tail_tokens)  # or a tail after them (vLLM keeps none)
                  and prompt - 1 - num_computed_tokens >= self.min_tail_tokens)
        if self._pool is None:
            if st.caller is None and st.lookup_started == 0.0:
                st.lookup_started = time.monotonic()
                self._admit(st)
            if st.caller is None or not wanted:
                return 0, False
            st.matched = self._lookup_now(st, n_blocks, num_computed_tokens)
        else:  # remote: admission and lookup on the lookup thread, never in this one
            if st.lookup is None:
                st.lookup = self._pool.submit(self._admit_and_lookup, st, n_blocks, wanted,
                                              num_computed_tokens)
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
        if st.tail is not None and tokens >= num_computed_tokens:
            tokens = st.tail.end
        new = max(0, tokens - num_computed_tokens)
        self.counters.add(matched_tokens=new)
        return new, self.async_load and new > 0

    def _admit_and_lookup(self, st: _Req, n_blocks: int, wanted: bool, local: int
                          ) -> list[PageIdentity]:
        self._admit(st)
        if st.caller is not None and not wanted:  # vLLM's cache serves it: a reader, still
            self.matcher.claim(st.caller, st.request, st.hashes, local // self.block_size)
        return self._lookup_now(st, n_blocks, local) if st.caller and wanted else []

    def _lookup_now(self, st: _Req, n_blocks: int, local: int) -> list[PageIdentity]:
        assert st.caller is not None
        t0 = time.perf_counter()
        try:
            found = self.matcher.match(st.caller, st.request, st.hashes, n_blocks,
                                       local // self.block_size)
            st.resave_from, st.tail = found.resave_from, found.tail
            return found.blocks
        except BackendUnavailable as exc:
            self._unavailable(st, "lookup", exc)
        except CallerRefused as exc:
            st.errors.append(str(exc))
        finally:
            self.counters.add(lookup_us=int((time.perf_counter() - t0) * 1e6))
        return []

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int
                                 ) -> None:
        st = self._reqs.get(request.request_id)
        if st is None or st.caller is None:
            return
        block_ids = blocks.get_block_ids()[0]
        first = st.local_tokens // self.block_size
        last = (st.local_tokens + num_external_tokens) // self.block_size
        loads = [BlockOp(st.matched[i], block_ids[i]) for i in range(first, last)]
        if st.tail is not None and st.local_tokens + num_external_tokens == st.tail.end:
            loads.append(BlockOp(st.tail, block_ids[last]))
        st.load_tokens = num_external_tokens or st.load_tokens  # (0: resumed, none now)
        # embedded: vLLM's own hit's held blocks as saves: the worker, skipping them, makes
        # this session one of their readers (no other session's retire drops them then)
        local = min(first, st.resave_from, len(st.matched)) if hasattr(self.backend, "expect") else 0
        held = tuple(BlockOp(st.matched[i], block_ids[i]) for i in range(local))
        if loads or held:
            self._ops.append(RequestOps(request.request_id, st.caller, tuple(loads), held,
                                        async_load=self.async_load and bool(loads)))

    def build_connector_meta(self, so: Any) -> AgentKVConnectorMetadata:
        meta = AgentKVConnectorMetadata(requests=self._ops,
                                        outages=getattr(self.backend, "outages", 0))
        self._ops = []
        if self.hints is not None:
            self._standalone_hints()
        for new in so.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            st.saved_upto = min(len(st.matched), st.resave_from)  # those are held already
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
        if isinstance(self.closes, RetireHold):  # embedded: the events go to the worker,
            meta.events = self.closes.take(self.backend.take_events())  # see retiring.py
        return meta

    def _standalone_hints(self) -> None:
        """Apply the hints sent on their own (a tool started, ...) since the last step."""
        assert self.hints is not None
        for hints in self.hints.take(self.counters):
            try:
                if self._pool is not None:  # remote: never on the scheduler's thread
                    self._pool.submit(self._apply_hints, hints)
                else:
                    self._apply_hints(hints)
            except Exception:  # never into vLLM's scheduler: a datagram cannot stop it
                self.counters.add(hint_errors=1)
                log.exception("AgentKV: standalone hint failed; ignored")

    def _apply_hints(self, hints: AgentHints) -> None:
        st = _Req(request=None, hints=hints)
        self._admit(st)
        for err in st.errors:
            log.warning("AgentKV: standalone hint for %s: %s", hints.session, err)

    def load_failed(self, failed: dict[str, int]) -> None:
        """The worker could not restore these tokens; vLLM recomputes them."""
        for req_id, tokens in failed.items():
            st = self._reqs.get(req_id)
            if st is not None:
                st.load_tokens = max(0, st.load_tokens - tokens)
                st.errors.append(f"{tokens} tokens could not be restored; recomputed")

    def forget(self, dropped: set[bytes]) -> None:
        if dropped and hasattr(self.backend, "forget"):  # the embedded directory's mirror
            self.backend.forget(dropped)

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
        full = min((computed + scheduled) // self.block_size, len(st.block_ids),
                   len(st.request.all_token_ids) // self.block_size)
        saves: tuple[BlockOp, ...] = ()
        if full > st.saved_upto:
            ns = PUBLIC_NAMESPACE if st.publish else st.caller.tenant
            ids = self.matcher.identities(st.request, st.hashes, full, ns)
            saves = tuple(BlockOp(ids[b], st.block_ids[b]) for b in range(st.saved_upto, full))
            st.saved_upto = full
            expect = getattr(self.backend, "expect", None)  # the embedded directory's mirror
            if expect is not None:
                for op in saves:
                    expect(op.identity)
        end, req = computed + scheduled, st.request
        if (self.min_tail_tokens and not st.tail_saved and end == len(req.all_token_ids)
                and len(req.output_token_ids) + 1 >= getattr(req, "max_tokens", 1 << 62)):
            # its last step (max_tokens): the forward leaves the tail in the last block,
            # copied out right after it, before vLLM frees the request's blocks
            tail = self._tail_op(st, end)
            if tail is not None:
                saves += (tail,)
        if saves:
            meta.requests.append(RequestOps(req_id, st.caller, saves=saves))

    def _tail_op(self, st: _Req, end: int) -> BlockOp | None:
        """Save the partly filled block holding tokens up to ``end`` (the agent's next
        prompt repeats them); None for a short tail or unsaved full blocks before it."""
        assert st.caller is not None
        index, n = divmod(end, self.block_size)
        if n < self.min_tail_tokens or index >= len(st.block_ids) or st.saved_upto < index:
            return None
        ns = PUBLIC_NAMESPACE if st.publish else st.caller.tenant
        ident = self.matcher.tail(st.request, st.hashes, ns, end)
        expect = getattr(self.backend, "expect", None)
        if expect is not None:
            expect(ident)
        st.tail_saved = True
        return BlockOp(ident, st.block_ids[index])

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is None:
            return False, None
        report: dict[str, Any] = {"restored_tokens": st.load_tokens,
                                  "tenant": st.caller.tenant if st.caller else None}
        delay = False
        try:
            delay = self._save_tail(st, request, block_ids)
            if self.closes is not None and st.hints is not None:  # see retiring.py
                delay = self.closes.finish(request.request_id, st, self._ops, delay)
        except Exception:  # never into vLLM's scheduler: no tail saved, or the session kept
            log.exception("AgentKV: finishing %s failed", request.request_id)
        if st.errors:
            report["errors"] = st.errors
        return delay, {KEY: report}

    def _save_tail(self, st: _Req, request: Any, block_ids: list[int]) -> bool:
        """A request that stopped before ``max_tokens`` (a stop token or string): its tail
        was not planned with its last step. vLLM then keeps the request's blocks until the
        next step's ``wait_for_save`` copied the tail out and ``get_finished`` reports it
        (they stay allocated one step longer). True when that was planned."""
        if (st.caller is None or st.tail_saved or not self.min_tail_tokens
                or not getattr(request, "output_token_ids", None)):
            return False  # planned already, or nothing ran (aborted, still loading)
        st.block_ids = list(block_ids)
        computed = min(request.num_computed_tokens, len(request.all_token_ids) - 1)
        op = self._tail_op(st, computed)
        if op is None:
            return False
        self._ops.append(RequestOps(request.request_id, st.caller, saves=(op,), release=True))
        return True

    def released(self, req_ids: set[str] | None) -> None:
        """vLLM freed these finished requests' blocks (``finished_sending``)."""
        if self.closes is not None and req_ids:
            self.closes.released(req_ids)

    def close(self, timeout_s: float = CLOSE_FLUSH_S) -> None:
        """Stop; the session closes not sent yet are sent first, for at most ``timeout_s``
        (the requests they waited for will not finish now)."""
        if self.hints is not None:
            self.hints.close()
        if self._pool is None:
            return
        for st in self._reqs.values():
            if st.lookup is not None:  # one not started yet would only delay the closes
                st.lookup.cancel()
        if isinstance(self.closes, CloseSender):
            self.closes.flush(((rid, st) for rid, st in self._reqs.items()
                               if st.hints is not None), timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
