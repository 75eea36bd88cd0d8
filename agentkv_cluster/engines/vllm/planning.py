"""What the scheduler side keeps per request, and the saves it plans from it (no KV bytes).

Each step, the blocks a request's step leaves full (computed) are saved once: blocks
``[0, saved_upto)`` are held or planned already. A request's partly filled last block
(its tail) is saved when it finishes: planned with its last step when it ends at
``max_tokens``, otherwise when vLLM reports it finished, which then keeps the request's
blocks until the next step's ``wait_for_save`` copied the tail out.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agentkv_cluster.engines.vllm.backend import BlockBackend, Caller
from agentkv_cluster.engines.vllm.hints import AgentHints
from agentkv_cluster.engines.vllm.matching import PrefixMatcher
from agentkv_cluster.engines.vllm.meta import AgentKVConnectorMetadata, BlockOp, RequestOps
from agentkv_cluster.lifecycle.identity import PageIdentity
from security.keyring import PUBLIC_NAMESPACE

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReqState:
    """One request from its arrival to ``request_finished``."""

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
    # an asynchronous load vLLM waits for (not reported in ``finished_recving`` yet):
    # vLLM itself then keeps the request's blocks when it is aborted
    loading: bool = False
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks [0, saved_upto) are held or planned
    resave_from: int = 0  # the first block neither held nor restored
    tail_saved: bool = False  # the partial last block of its final step is planned
    # never looked up nor saved (from now on): its KV depends on more than its token ids
    # (images, prompt embeddings), which block identities do not cover; or it holds a
    # block that failed to load for another request (vLLM recomputes it, or, under async
    # scheduling, may have computed on it meanwhile)
    unsavable: bool = False
    hashes: list[bytes] = field(default_factory=list)


class SavePlanner:
    def __init__(self, backend: BlockBackend, matcher: PrefixMatcher, block_size: int,
                 min_tail_tokens: int) -> None:
        self.backend = backend
        self.matcher = matcher
        self.block_size = block_size
        self.min_tail_tokens = min_tail_tokens  # 0: tails are never saved

    def plan(self, meta: AgentKVConnectorMetadata, st: ReqState, req_id: str, computed: int,
             scheduled: int) -> None:
        """The saves of ``st``'s step, which computes ``scheduled`` tokens after
        ``computed``, into ``meta``."""
        try:
            self._plan(meta, st, req_id, computed, scheduled)
        except Exception:  # never into vLLM's scheduler: this request just is not saved
            log.exception("AgentKV: planning saves for %s failed", req_id)
            st.caller = None

    def _plan(self, meta: AgentKVConnectorMetadata, st: ReqState, req_id: str, computed: int,
              scheduled: int) -> None:
        assert st.caller is not None
        if st.unsavable:
            return
        full = min((computed + scheduled) // self.block_size, len(st.block_ids),
                   len(st.request.all_token_ids) // self.block_size)
        saves: tuple[BlockOp, ...] = ()
        if full > st.saved_upto:
            ns = PUBLIC_NAMESPACE if st.publish else st.caller.tenant
            ids = self.matcher.identities(st.request, st.hashes, full, ns)
            saves = tuple(BlockOp(ids[b], st.block_ids[b]) for b in range(st.saved_upto, full))
            st.saved_upto = full
            for op in saves:
                self._expect(op.identity)
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

    def finished(self, st: ReqState, request: Any, block_ids: list[int],
                 ops: list[RequestOps]) -> bool:
        """A request that stopped before ``max_tokens`` (a stop token or string): its tail
        was not planned with its last step. vLLM then keeps the request's blocks until the
        next step's ``wait_for_save`` copied the tail out and ``get_finished`` reports it
        (they stay allocated one step longer): a release in ``ops``. True when that was
        planned."""
        if (st.caller is None or st.unsavable or st.tail_saved or not self.min_tail_tokens
                or not getattr(request, "output_token_ids", None)):
            return False  # planned already, or nothing ran (aborted)
        if st.loading:  # preempted, aborted while reloading: vLLM keeps its blocks until
            return False  # the load is reported and frees them then (a release: twice)
        st.block_ids = list(block_ids)
        computed = min(request.num_computed_tokens, len(request.all_token_ids) - 1)
        op = self._tail_op(st, computed)
        if op is None:
            return False
        ops.append(RequestOps(request.request_id, st.caller, saves=(op,), release=True))
        return True

    def _tail_op(self, st: ReqState, end: int) -> BlockOp | None:
        """Save the partly filled block holding tokens up to ``end`` (the agent's next
        prompt repeats them); None for a short tail or unsaved full blocks before it."""
        assert st.caller is not None
        index, n = divmod(end, self.block_size)
        if n < self.min_tail_tokens or index >= len(st.block_ids) or st.saved_upto < index:
            return None
        ns = PUBLIC_NAMESPACE if st.publish else st.caller.tenant
        ident = self.matcher.tail(st.request, st.hashes, ns, end)
        self._expect(ident)
        st.tail_saved = True
        return BlockOp(ident, st.block_ids[index])

    def _expect(self, identity: PageIdentity) -> None:
        expect = getattr(self.backend, "expect", None)  # the embedded directory's mirror
        if expect is not None:
            expect(identity)
