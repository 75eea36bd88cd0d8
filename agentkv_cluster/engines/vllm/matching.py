"""Which of a prompt's blocks the backend holds: the scheduler side's lookups (no KV bytes).

A block's identity follows the prompt's hash chain (``blocks.chain_hashes``, salted by the
LoRA adapter and vLLM's cache salt) in one namespace: the tenant's, or the opt-in PUBLIC
one. ``PrefixMatcher.match`` finds the longest run of blocks held after vLLM's own
prefix-cache hit, in any namespace the caller may read, and then the longest saved
partial block (a "tail") that continues it; ``tail`` names the partial block a finished
request leaves and remembers its length, so a later prompt that repeats those tokens can
find it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.engines.vllm.backend import (
    BackendUnavailable,
    BlockBackend,
    Caller,
    CallerRefused,
)
from agentkv_cluster.engines.vllm.blocks import (
    EngineVersions,
    block_identity,
    chain_hashes,
    chain_next,
    chain_seed,
)
from agentkv_cluster.lifecycle.identity import PageIdentity

MAX_TAILS = 1 << 16  # tail lengths remembered (oldest dropped first)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Match:
    """What ``PrefixMatcher.match`` found for one prompt."""

    blocks: list[PageIdentity]  # the prompt's blocks up to the end of the held run
    tail: PageIdentity | None  # a held partial block right after them
    resave_from: int  # the first block neither held nor loaded (saves resume there)


def _adapter(request: Any) -> str:
    return str(getattr(getattr(request, "lora_request", None), "lora_name", "") or "")


def _salt(request: Any) -> str:
    return f"{getattr(request, 'lora_request', None) or ''}|{getattr(request, 'cache_salt', '')}"


class PrefixMatcher:
    def __init__(self, backend: BlockBackend, versions: EngineVersions, block_size: int) -> None:
        self.backend = backend
        self.versions = versions
        self.block_size = block_size
        # tails saved, by (namespace, chain hash of the blocks before them): their lengths
        self.tails: dict[tuple[str, bytes], set[int]] = {}

    def identities(self, request: Any, hashes: list[bytes], n_blocks: int, namespace: str
                   ) -> list[PageIdentity]:
        """The first ``n_blocks`` blocks of ``request`` in ``namespace``; ``hashes`` is the
        request's chain, extended in place when it is too short."""
        if len(hashes) < n_blocks:
            hashes[:] = chain_hashes(request.all_token_ids[:n_blocks * self.block_size],
                                     self.block_size, _salt(request))
        adapter = _adapter(request)
        return [block_identity(self.versions, namespace=namespace, adapter=adapter,
                               chain=h, index=i, block_size=self.block_size)
                for i, h in enumerate(hashes[:n_blocks])]

    def match(self, caller: Caller, request: Any, hashes: list[bytes], n_blocks: int,
              start: int) -> Match:
        """The prompt's blocks up to the end of the longest run held from block ``start``
        on (vLLM's own prefix cache holds the ``start`` blocks before it: they need not be
        in the store), each in the tenant's namespace or (opt-in) PUBLIC; then the longest
        held tail that continues it."""
        per_ns = {ns: self.identities(request, hashes, n_blocks, ns)
                  for ns in caller.read_namespaces()}
        own = next(iter(per_ns.values()))
        start = min(start, n_blocks)
        matched: list[PageIdentity] = own[:start]
        held_local = self.backend.lookup(caller, own[:start]) if start else 0
        while len(matched) < n_blocks:
            step = 0
            for ids in per_ns.values():
                step = self.backend.lookup(caller, ids[len(matched):])
                if step:
                    matched.extend(ids[len(matched):len(matched) + step])
                    break
            if not step:
                break
        return Match(blocks=matched,
                     tail=self._held_tail(caller, request, hashes, len(matched)),
                     resave_from=held_local if held_local < start else len(matched))

    def claim(self, caller: Caller, request: Any, hashes: list[bytes], blocks: int) -> None:
        """vLLM's own prefix cache holds the prompt's first ``blocks`` blocks, so nothing is
        loaded or looked up for them; a lookup of them in the tenant's namespace still tells
        a backend that tracks readers that this session reads them (the service: a lookup
        makes the session a holder of what it finds, so another session's close keeps
        them). A failure costs only that (the admission reports an outage): never raised."""
        if blocks <= 0:
            return
        own = self.identities(request, hashes, blocks, caller.read_namespaces()[0])
        try:
            self.backend.lookup(caller, own)
        except (BackendUnavailable, CallerRefused) as exc:
            log.debug("AgentKV: could not mark session %s a reader of its prefix: %s",
                     caller.session, exc)

    def _parent(self, request: Any, hashes: list[bytes], index: int) -> bytes:
        return hashes[index - 1] if index else chain_seed(_salt(request))

    def _held_tail(self, caller: Caller, request: Any, hashes: list[bytes], index: int
                   ) -> PageIdentity | None:
        """A saved tail at block ``index`` whose tokens the prompt repeats (vLLM computes
        at least the prompt's last token itself)."""
        bs = self.block_size
        room = len(request.prompt_token_ids or ()) - 1 - index * bs
        parent = self._parent(request, hashes, index)
        adapter = _adapter(request)
        for ns in caller.read_namespaces():
            for n in sorted(self.tails.get((ns, parent), ()), reverse=True):
                if n > room:
                    continue
                toks = request.prompt_token_ids[index * bs:index * bs + n]
                ident = block_identity(self.versions, namespace=ns, adapter=adapter,
                                       chain=chain_next(parent, toks), index=index,
                                       block_size=bs, tokens=n)
                if self.backend.lookup(caller, [ident]):
                    return ident
        return None

    def tail(self, request: Any, hashes: list[bytes], namespace: str, end: int
             ) -> PageIdentity:
        """The partly filled block holding ``request``'s tokens up to ``end`` (not a block
        boundary), remembered so that a later prompt repeating them can match it."""
        bs = self.block_size
        index, n = divmod(end, bs)
        self.identities(request, hashes, index, namespace)  # the chain up to the tail
        parent = self._parent(request, hashes, index)
        ident = block_identity(self.versions, namespace=namespace, adapter=_adapter(request),
                               block_size=bs, index=index,
                               chain=chain_next(parent, request.all_token_ids[index * bs:end]),
                               tokens=n)
        self.tails.setdefault((namespace, parent), set()).add(n)
        if len(self.tails) > MAX_TAILS:  # the oldest entries first (dicts keep order)
            del self.tails[next(iter(self.tails))]
        return ident
