"""Scheduler side of the connector: bookkeeping only, no KV bytes.

Per request: parse the hints, resolve the caller (tenant from the token), forward the
lifecycle events, find the longest prefix of the prompt's blocks the backend holds,
remember which vLLM blocks the restored tokens land in, and plan, each step, the blocks
that become full (computed) and must be saved (``planning.py``). A remote lookup
(service backend) runs on a background thread; until it answers, vLLM is told "not yet"
(``None``) and keeps scheduling other requests; a lookup that takes longer than
``lookup_timeout_s`` counts as a miss. Nothing here waits on the store.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from agentkv_cluster.engines.vllm.backend import (
    BackendUnavailable,
    BlockBackend,
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
from agentkv_cluster.engines.vllm.matching import Match, PrefixMatcher
from agentkv_cluster.engines.vllm.meta import (
    AgentKVConnectorMetadata,
    BlockOp,
    FailedLoad,
    RequestOps,
)
from agentkv_cluster.engines.vllm.planning import ReqState, SavePlanner
from agentkv_cluster.engines.vllm.retiring import CloseSender, RetireHold, retiring_for

log = logging.getLogger(__name__)
CLOSE_FLUSH_S = 10.0  # at shutdown, how long the session closes not sent yet may take


def _miss() -> Match:
    return Match(blocks=[], tail=None, resave_from=0)


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
        self._reqs: dict[str, ReqState] = {}
        self._ops: list[RequestOps] = []  # loads and releases for the next metadata
        self._failures_seen = 0  # the latest failed load read (``FailedLoad.step``)
        self.matcher = PrefixMatcher(backend, versions, block_size)
        self.saves = SavePlanner(backend, self.matcher, block_size, min_tail_tokens)
        self.closes = retiring_for(backend, self._pool)  # task_end waits for in-flight work

    # -- per request ---------------------------------------------------------------------
    def _state(self, request: Any) -> ReqState:
        st = self._reqs.get(request.request_id)
        if st is not None:
            return st
        st = self._reqs[request.request_id] = ReqState(request=request)
        # images or prompt embeddings: the same token ids can hold other KV
        st.unsavable = bool(getattr(request, "mm_features", None)) or \
            getattr(request, "prompt_embeds", None) is not None
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

    def _admit(self, st: ReqState) -> None:
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

    def _unavailable(self, st: ReqState, what: str, exc: Exception) -> None:
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
                st.caller, st.matched, st.tail = None, [], None
                st.errors.append("internal error in the AgentKV lookup; recomputed")
            return 0, False

    def _matched(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        st = self._state(request)
        if st.hints is None:
            return 0, False
        st.local_tokens = num_computed_tokens
        prompt = len(request.prompt_token_ids or ())
        n_blocks = max(0, (prompt - 1) // self.block_size)  # vLLM computes >= 1 token itself
        wanted = not st.unsavable and (
            n_blocks * self.block_size > num_computed_tokens  # blocks past vLLM's hit
            or bool(self.min_tail_tokens)  # or a tail after them (vLLM keeps none)
            and prompt - 1 - num_computed_tokens >= self.min_tail_tokens)
        if self._pool is None:
            if st.caller is None and st.lookup_started == 0.0:
                st.lookup_started = time.monotonic()
                self._admit(st)
            if st.caller is None or not wanted:
                return 0, False
            found = self._lookup_now(st, n_blocks, num_computed_tokens)
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
                found = _miss()
            else:
                found = st.lookup.result()
            if st.caller is None:  # not admitted, or given up on since (an internal error):
                return 0, False  # no load would be planned for what it found
        # taken whole, here: the tail only continues the blocks found with it (a stale one
        # after a failed or timed-out lookup claimed tokens no load would fill)
        st.matched, st.tail, st.resave_from = found.blocks, found.tail, found.resave_from
        self.counters.add(lookups=1)
        tokens = len(st.matched) * self.block_size
        if st.tail is not None and tokens >= num_computed_tokens:
            tokens = st.tail.end
        new = max(0, tokens - num_computed_tokens)
        self.counters.add(matched_tokens=new)
        return new, self.async_load and new > 0

    def _admit_and_lookup(self, st: ReqState, n_blocks: int, wanted: bool, local: int
                          ) -> Match:
        self._admit(st)
        if st.caller is not None and not wanted and not st.unsavable:  # vLLM's cache
            # serves it: this session is one of its blocks' readers, still
            self.matcher.claim(st.caller, st.request, st.hashes, local // self.block_size)
        return self._lookup_now(st, n_blocks, local) if st.caller and wanted else _miss()

    def _lookup_now(self, st: ReqState, n_blocks: int, local: int) -> Match:
        assert st.caller is not None
        t0 = time.perf_counter()
        try:
            return self.matcher.match(st.caller, st.request, st.hashes, n_blocks,
                                      local // self.block_size)
        except BackendUnavailable as exc:
            self._unavailable(st, "lookup", exc)
        except CallerRefused as exc:
            st.errors.append(str(exc))
        finally:
            self.counters.add(lookup_us=int((time.perf_counter() - t0) * 1e6))
        return _miss()

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int
                                 ) -> None:
        st = self._reqs.get(request.request_id)
        if st is None or st.caller is None:
            return
        block_ids = blocks.get_block_ids()[0]
        try:
            self._plan_loads(st, request.request_id, block_ids, num_external_tokens)
        except Exception:  # never into vLLM's scheduler; but vLLM counts those tokens as
            # restored now: the worker reports their blocks failed, so they are recomputed
            log.exception("AgentKV: planning the restore of %s failed", request.request_id)
            st.errors.append("internal error in the AgentKV restore; recomputed")
            bs, end = self.block_size, st.local_tokens + num_external_tokens
            lost = tuple(block_ids[st.local_tokens // bs:-(-end // bs)])
            st.load_tokens, st.loading = 0, self.async_load and bool(lost)
            if lost:
                self._ops.append(RequestOps(request.request_id, st.caller, unrestored=lost,
                                            async_load=st.loading))

    def _plan_loads(self, st: ReqState, req_id: str, block_ids: list[int],
                    num_external_tokens: int) -> None:
        assert st.caller is not None
        end = st.local_tokens + num_external_tokens
        first, last = st.local_tokens // self.block_size, end // self.block_size
        loads = [BlockOp(st.matched[i], block_ids[i]) for i in range(first, last)]
        tail = st.tail is not None and end == st.tail.end
        if tail:
            loads.append(BlockOp(st.tail, block_ids[last]))
        st.load_tokens = num_external_tokens or st.load_tokens  # (0: resumed, none now)
        st.loading = self.async_load and bool(loads)
        # embedded: vLLM's own hit's held blocks as saves: the worker, skipping them, makes
        # this session one of their readers (no other session's retire drops them then)
        local = min(first, st.resave_from, len(st.matched)) if hasattr(self.backend, "expect") else 0
        held = tuple(BlockOp(st.matched[i], block_ids[i]) for i in range(local))
        if loads or held:
            self._ops.append(RequestOps(req_id, st.caller, tuple(loads), held, tail=tail,
                                        async_load=st.loading))

    def build_connector_meta(self, so: Any) -> AgentKVConnectorMetadata:
        meta = AgentKVConnectorMetadata(requests=self._ops,
                                        outages=getattr(self.backend, "outages", 0),
                                        failures_seen=self._failures_seen)
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
            self.saves.plan(meta, st, new.req_id, new.num_computed_tokens,
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
            self.saves.plan(meta, st, req_id, cached.num_computed_tokens[i],
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
        st = ReqState(request=None, hints=hints)
        self._admit(st)
        for err in st.errors:
            log.warning("AgentKV: standalone hint for %s: %s", hints.session, err)

    def loaded(self, req_ids: set[str] | None) -> None:
        """The worker finished these asynchronous loads (``finished_recving``)."""
        for req_id in req_ids or ():
            st = self._reqs.get(req_id)
            if st is not None:
                st.loading = False

    def load_failed(self, failed: dict[str, FailedLoad]) -> None:
        """The worker could not restore the last ``tokens`` of these requests' loads.
        vLLM recomputes them from the first block not restored, and the worker saved
        nothing of the steps planned before this report (``failures_seen``): those blocks
        are not held, so their saves are planned again as they are recomputed."""
        for req_id, failure in failed.items():
            self._failures_seen = max(self._failures_seen, failure.step)
            st = self._reqs.get(req_id)
            if st is None:
                continue
            tokens = failure.tokens
            bad = max(0, st.local_tokens + st.load_tokens - tokens) // self.block_size
            st.load_tokens = max(0, st.load_tokens - tokens)
            st.matched, st.tail = st.matched[:bad], None
            st.saved_upto, st.tail_saved = min(st.saved_upto, bad), False
            st.errors.append(f"{tokens} tokens could not be restored; recomputed")

    def saves_skipped(self, skipped: dict[str, int], invalid: set[int],
                      failed: set[str]) -> None:
        """The worker skipped these requests' saves from these tokens on (planned before
        a failed load was read): planned again. A request other than those whose load
        failed that holds one of the ``invalid`` blocks (a prefix-cache hit on a block
        that never loaded) is not saved again: vLLM recomputes it, or, with async
        scheduling, may already have computed on it."""
        for req_id, start in skipped.items():
            st = self._reqs.get(req_id)
            if st is not None:
                st.saved_upto, st.tail_saved = min(st.saved_upto, start // self.block_size), False
        for req_id, st in self._reqs.items() if invalid else ():
            if req_id not in failed and not invalid.isdisjoint(st.block_ids):
                st.unsavable = True

    def forget(self, dropped: set[bytes]) -> None:
        if dropped and hasattr(self.backend, "forget"):  # the embedded directory's mirror
            self.backend.forget(dropped)

    def request_finished(self, request: Any, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is None:
            return False, None
        report: dict[str, Any] = {"restored_tokens": st.load_tokens,
                                  "tenant": st.caller.tenant if st.caller else None}
        delay = False
        try:
            delay = self.saves.finished(st, request, block_ids, self._ops)
            if self.closes is not None and st.hints is not None:  # see retiring.py
                delay = self.closes.finish(request.request_id, st, self._ops, delay)
        except Exception:  # never into vLLM's scheduler: no tail saved, or the session kept
            log.exception("AgentKV: finishing %s failed", request.request_id)
        if st.errors:
            report["errors"] = st.errors
        return delay, {KEY: report}

    def released(self, req_ids: set[str] | None) -> None:
        """The worker released these finished requests: vLLM freed their blocks
        (``finished_sending``), or a barrier of one vLLM held itself passed."""
        if self.closes is not None and req_ids:
            self.closes.released(req_ids)

    @property
    def awaiting_barriers(self) -> bool:
        """A session's hint waits for a barrier only the worker's metadata reports: vLLM
        holds no request for it, so only this keeps the engine stepping meanwhile."""
        return self.closes is not None and bool(self.closes.barriers)

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
