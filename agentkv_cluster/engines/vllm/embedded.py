"""The embedded backend: block pages in a host pool and an NVMe shard inside the vLLM
process (one node, no Ray, no service).

Each tier keeps its own `EvictionPolicy` of the chosen strategy: ``lru`` (the
project's `LruPolicy`: least recently used first, no lifecycle signals) or ``agentkv``
(`AgentKvPolicy`: value density from the hints, blocks of ended tasks and abandoned
branches retired at once). A block evicted from the host pool is demoted to the NVMe
shard; one evicted from the shard is dropped. A block read from the shard is promoted
back. The store lives in the worker process (it holds the bytes); the scheduler process
keeps an `EmbeddedDirectory`, a mirror of what is held, and verifies tokens with the
service's secret (`TokenResolver`), so tenants are the ones in the verified tokens.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentkv_cluster.engines.vllm.backend import BackendUnavailable, Caller, CallerRefused
from agentkv_cluster.engines.vllm.config import EmbeddedSpec
from agentkv_cluster.engines.vllm.directory import TenantErasures, check_access
from agentkv_cluster.engines.vllm.hints import HintEvent, HintKind
from agentkv_cluster.lifecycle.identity import PageIdentity
from agentkv_cluster.lifecycle.types import StateType
from agentkv_cluster.policy.agentkv import AgentKvPolicy
from agentkv_cluster.policy.base import EndOfLife, EvictionPolicy, PageView
from agentkv_cluster.policy.baselines import LruPolicy
from store.host_pool import HostPool, PoolError
from store.nvme import NvmeShard, NvmeShardConfig
from store.types import Lookup, Tier

__all__ = ["EmbeddedBackend", "EmbeddedSpec"]
log = logging.getLogger(__name__)
_DEFAULT_GAP_S = 2.0


@dataclass(slots=True)
class _Block:
    view: PageView
    tier: Tier
    slot: int = -1  # host pool slot
    # readers as (tenant, session, branch): names repeat across tenants, and a branch
    # abandoned leaves the blocks other branches of its session read
    sessions: set[tuple[str, str, str]] | None = None


def _reader(caller: Caller) -> tuple[str, str, str]:
    return (caller.tenant, caller.session, caller.branch)


def _policy(strategy: str) -> EvictionPolicy:
    return AgentKvPolicy() if strategy == "agentkv" else LruPolicy()


class EmbeddedBackend:
    name = "embedded"

    def __init__(self, spec: EmbeddedSpec) -> None:
        self.spec = spec
        self._lock = threading.RLock()
        self._pool = HostPool.create(f"agentkv-vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                     spec.slot_bytes, spec.host_blocks)
        self._pool.unlink()  # private to this process: nothing left in /dev/shm if it is killed
        self._scratch = bytearray(spec.slot_bytes)
        self._nvme_dir = Path(spec.nvme_dir) if spec.nvme_dir else None
        self._nvme: NvmeShard | None = None
        if spec.nvme_blocks:
            if self._nvme_dir is None:
                self._nvme_dir = Path(tempfile.mkdtemp(prefix="agentkv-vllm-nvme-"))
            self._nvme = NvmeShard(self._nvme_dir / f"shard-{os.getpid()}",
                                   NvmeShardConfig(max_record_bytes=spec.slot_bytes))
        self._tiers: dict[Tier, EvictionPolicy] = {Tier.HOST: _policy(spec.strategy),
                                                    Tier.NVME: _policy(spec.strategy)}
        self._blocks: dict[bytes, _Block] = {}  # identity digest -> block
        self._by_id: dict[int, bytes] = {}
        self._sessions: dict[tuple[str, str], set[bytes]] = {}
        self._gaps: dict[str, float] = {}  # tool class -> smoothed gap (s)
        # session -> (tool class, start, predicted gap: the framework's or the learned one)
        self._tool_started: dict[tuple[str, str], tuple[str, float, float | None]] = {}
        self._prefetched: set[tuple[str, str]] = set()
        self._ids = itertools.count(1)
        self._dropped: set[bytes] = set()
        self._erasures = TenantErasures(spec.keys_dir) if spec.keys_dir else None
        self._closed = False
        atexit.register(self.close)

    def resolve(self, token: str | None, session: str | None) -> Caller:
        raise CallerRefused("the worker-side store receives callers from the scheduler")

    # -- blocks ----------------------------------------------------------------------
    def lookup(self, caller: Caller, identities: Sequence[PageIdentity]) -> int:
        n = 0
        with self._lock:
            self._alive(caller)
            for ident in identities:
                check_access(caller, ident, write=False)
                if ident.digest() not in self._blocks:
                    break
                n += 1
        return n

    def contains(self, caller: Caller, identity: PageIdentity) -> bool:
        check_access(caller, identity, write=False)
        with self._lock:
            self._alive(caller)
            return identity.digest() in self._blocks

    def claim(self, caller: Caller, identities: Sequence[PageIdentity]) -> None:
        """``caller`` uses these blocks in this step (it restores them, or computed them or
        found them in vLLM's own cache while held here): one of their readers from now,
        so another session's retiring event keeps them. Blocks it may not read, or not
        held, are left as they are."""
        with self._lock:
            for ident in identities:
                try:
                    check_access(caller, ident, write=False)
                except CallerRefused:
                    continue
                key, block = ident.digest(), self._blocks.get(ident.digest())
                if block is not None and block.sessions is not None:
                    block.sessions.add(_reader(caller))
                    self._sessions.setdefault((caller.tenant, caller.session), set()).add(key)

    def get(self, caller: Caller, identity: PageIdentity) -> bytes | None:
        check_access(caller, identity, write=False)
        now = time.monotonic()
        with self._lock:
            self._alive(caller)
            key = identity.digest()
            block = self._blocks.get(key)
            if block is None:
                return None
            try:
                if block.tier is Tier.HOST:
                    data = bytes(self._pool.read(block.slot, out=self._scratch))
                else:
                    assert self._nvme is not None
                    got = self._nvme.get(key)
                    if got is Lookup.MISS:
                        self._forget(key)
                        return None
                    data = bytes(got)
                    self._promote(key, block, data, now)
            except (PoolError, OSError) as exc:
                raise BackendUnavailable(f"embedded store read failed: {exc}") from exc
            self._touch(caller, key, block, now)
            return data

    def put(self, caller: Caller, identity: PageIdentity, data: bytes) -> None:
        check_access(caller, identity, write=True)
        now = time.monotonic()
        with self._lock:
            self._alive(caller)
            key = identity.digest()
            if key in self._blocks:
                self._touch(caller, key, self._blocks[key], now)
                return
            view = PageView(page_id=next(self._ids), size_bytes=len(data),
                            state_type=StateType.TEMP_REASONING, session=caller.session,
                            tenant=identity.tenant, tier=Tier.HOST, position=identity.start,
                            tokens=identity.end - identity.start, created=now,
                            last_access=now, reuse_prob=0.5,
                            predicted_idle_s=_DEFAULT_GAP_S)
            block = _Block(view=view, tier=Tier.HOST, sessions={_reader(caller)})
            try:
                self._to_host(key, block, data, now)
            except (PoolError, OSError) as exc:
                raise BackendUnavailable(f"embedded store write failed: {exc}") from exc
            self._blocks[key] = block
            self._by_id[view.page_id] = key
            self._sessions.setdefault((caller.tenant, caller.session), set()).add(key)

    # -- lifecycle hints ---------------------------------------------------------------
    def event(self, caller: Caller, event: HintEvent) -> None:
        now = time.monotonic()
        sess = (caller.tenant, caller.session)
        with self._lock:
            keys = [k for k in self._sessions.get(sess, ()) if k in self._blocks]
            self._prefetched.discard(sess)
            if event.kind is HintKind.TOOL_START:
                gap = event.expected_s or self._gaps.get(event.tool, _DEFAULT_GAP_S)
                self._tool_started[sess] = (event.tool, now,
                                            event.expected_s or self._gaps.get(event.tool))
                self._update(keys, now, tool_class=event.tool, predicted_idle_s=gap,
                             reuse_prob=0.95)
            elif event.kind in (HintKind.OBSERVATION_RETURN, HintKind.MODEL_CALL,
                                HintKind.TASK_START):
                started = self._tool_started.pop(sess, None)
                if started is not None:  # learn the tool's gap (smoothed)
                    tool, t0, _ = started
                    old = self._gaps.get(tool, now - t0)
                    self._gaps[tool] = 0.7 * old + 0.3 * (now - t0)
                self._update(keys, now, tool_class="", predicted_idle_s=0.0, reuse_prob=0.95)
            elif event.kind is HintKind.TASK_END:
                self._end(sess, keys, now, EndOfLife.TASK_END, None)
            elif event.kind is HintKind.BRANCH_ABANDONED:
                self._end(sess, keys, now, EndOfLife.BRANCH_ABANDONED, event.branch)

    def _update(self, keys: list[bytes], now: float, **fields: object) -> None:
        for key in keys:
            block = self._blocks[key]
            for name, value in fields.items():
                setattr(block.view, name, value)
            block.view.last_access = min(block.view.last_access, now)
            policy = self._tiers[block.tier]
            if block.view.page_id in policy:  # type: ignore[operator]
                policy.on_update(block.view, now)

    def _end(self, sess: tuple[str, str], keys: list[bytes], now: float,
             signal: EndOfLife, branch: str | None) -> None:
        """The session's task ended (``branch`` None: every branch of it reads no more) or
        one branch was abandoned (the blocks that branch's requests wrote or read); a
        block no other reader holds is retired."""
        if branch is None:
            self._sessions.pop(sess, None)
            self._tool_started.pop(sess, None)
            self._prefetched.discard(sess)
        for key in keys:
            block = self._blocks[key]
            assert block.sessions is not None
            if branch is None:
                block.sessions -= {r for r in block.sessions if r[:2] == sess}
            else:
                block.sessions.discard((*sess, branch))
            if block.sessions:
                continue  # another session or branch shares this prefix block
            if branch is not None:
                self._sessions[sess].discard(key)
            block.view.reuse_prob = 0.0
            decision = self._tiers[block.tier].on_consumers_done(
                block.view, now, retirable=True, signal=signal)
            if decision.retire:
                self._drop(key, block)

    def prefetch_due(self) -> int:
        """AgentKV strategy: bring a paused session's blocks from the NVMe shard back to
        the host pool ``prefetch_lead_s`` before its tool is predicted to return (the gap
        learned per tool class from earlier calls). Blocks promoted."""
        if self.spec.strategy != "agentkv" or self._nvme is None:
            return 0
        now, n = time.monotonic(), 0
        with self._lock:
            if self._closed:
                return 0
            for sess, (_tool, t0, gap) in list(self._tool_started.items()):
                if (sess in self._prefetched or gap is None
                        or now < t0 + gap - self.spec.prefetch_lead_s):
                    continue
                self._prefetched.add(sess)
                keys = [k for k in self._sessions.get(sess, ()) if k in self._blocks]
                for key in keys:  # about to be read: as valuable as a block just used
                    self._blocks[key].view.last_access = now
                self._update(keys, now, predicted_idle_s=max(0.0, t0 + gap - now))
                for key in sorted(keys, key=lambda k: self._blocks[k].view.position):
                    if self._blocks[key].tier is Tier.NVME:
                        n += self._prefetch(key, self._blocks[key], now)
        return n

    def _prefetch(self, key: bytes, block: _Block, now: float) -> bool:
        """NVMe -> host for a block about to be read: it displaces only host blocks the
        policy ranks below it (``admit_prefetch``), else it stays where it is."""
        assert self._nvme is not None
        host = self._tiers[Tier.HOST]
        admit = getattr(host, "admit_prefetch", None)
        if admit is None:
            return False
        need = 0 if self._pool.stats().free_slots else self.spec.slot_bytes
        got = self._nvme.get(key)
        if got is Lookup.MISS:
            self._forget(key)
            return False
        data = bytes(got)
        decision = admit(block.view, need, now)  # tracks it in the host policy if admitted
        if not decision.admitted:
            return False
        self._tiers[Tier.NVME].on_remove(block.view.page_id)  # off NVMe before the victims
        self._nvme.delete(key)  # go there (their room must not be made by dropping it)
        for pid in decision.victims:  # untracked by the policy already
            self._demote(self._by_id[pid], now)
        slot = self._pool.alloc()
        self._pool.write(slot, data)
        block.tier, block.slot, block.view.tier = Tier.HOST, slot, Tier.HOST
        return True

    # -- tiers -------------------------------------------------------------------------
    def _touch(self, caller: Caller, key: bytes, block: _Block, now: float) -> None:
        block.view.last_access = now
        block.view.access_count += 1
        assert block.sessions is not None
        block.sessions.add(_reader(caller))
        self._sessions.setdefault((caller.tenant, caller.session), set()).add(key)
        self._tiers[block.tier].on_access(block.view, now)

    def _to_host(self, key: bytes, block: _Block, data: bytes, now: float) -> None:
        policy = self._tiers[Tier.HOST]
        if self._pool.stats().free_slots == 0:
            for pid in policy.select_victims(self.spec.slot_bytes, now) or []:
                self._demote(self._by_id[pid], now)
        if self._pool.stats().free_slots == 0:  # nothing evictable: keep it on NVMe
            self._to_nvme(key, block, data, now)
            return
        slot = self._pool.alloc()
        self._pool.write(slot, data)
        block.tier, block.slot, block.view.tier = Tier.HOST, slot, Tier.HOST
        policy.on_insert(block.view, now)

    def _to_nvme(self, key: bytes, block: _Block, data: bytes | memoryview, now: float) -> None:
        if self._nvme is None:
            self._forget(key)
            return
        policy = self._tiers[Tier.NVME]
        while len(policy) >= self.spec.nvme_blocks:  # type: ignore[arg-type]
            victims = policy.select_victims(self.spec.slot_bytes, now)
            if not victims:
                self._forget(key)
                return
            for pid in victims:
                self._drop(self._by_id[pid], self._blocks[self._by_id[pid]])
        self._nvme.put(key, data, 0)
        block.tier, block.slot, block.view.tier = Tier.NVME, -1, Tier.NVME
        policy.on_insert(block.view, now)

    def _demote(self, key: bytes, now: float) -> None:
        block = self._blocks[key]
        data = bytes(self._pool.read(block.slot, out=self._scratch))
        host = self._tiers[Tier.HOST]
        if block.view.page_id in host:  # type: ignore[operator]  # select_victims untracks
            host.on_remove(block.view.page_id)
        self._pool.free(block.slot)
        self._to_nvme(key, block, data, now)

    def _promote(self, key: bytes, block: _Block, data: bytes, now: float) -> None:
        assert self._nvme is not None
        self._tiers[Tier.NVME].on_remove(block.view.page_id)
        self._nvme.delete(key)
        self._to_host(key, block, data, now)

    def _drop(self, key: bytes, block: _Block, shred: bool = False) -> None:
        policy = self._tiers[block.tier]
        if block.view.page_id in policy:  # type: ignore[operator]
            policy.on_remove(block.view.page_id)
        if block.tier is Tier.HOST and block.slot >= 0:
            self._pool.free(block.slot)
        elif block.tier is Tier.NVME and self._nvme is not None:
            (self._nvme.shred if shred else self._nvme.delete)(key)  # shred: zeroed first
        self._forget(key)

    def _forget(self, key: bytes) -> None:
        block = self._blocks.pop(key, None)
        if block is not None:
            self._by_id.pop(block.view.page_id, None)
            self._dropped.add(key)

    def take_dropped(self) -> set[bytes]:
        """Digests no longer held since the last call (the scheduler's mirror forgets them)."""
        with self._lock:
            dropped, self._dropped = self._dropped, set()
            return dropped

    # -- state ---------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        with self._lock:
            host = sum(b.tier is Tier.HOST for b in self._blocks.values())
            return {"blocks": len(self._blocks), "host_blocks": host,
                    "nvme_blocks": len(self._blocks) - host}

    def _alive(self, caller: Caller | None = None) -> None:
        """Open, ``caller``'s tenant not erased since (an erased tenant's blocks go, zeroed)."""
        if self._closed:
            raise BackendUnavailable("the embedded store is closed")
        if self._erasures is not None:
            for tenant in self._erasures.newly_erased():
                for key in [k for k, b in self._blocks.items() if b.view.tenant == tenant]:
                    self._drop(key, self._blocks[key], shred=True)
                self._pool.scrub_free()  # a freed slot keeps its bytes until reused
            if caller is not None:
                self._erasures.check(caller)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._blocks.clear()
            self._pool.close()
            self._pool.unlink()
            if self._nvme is not None:
                self._nvme.close()
                # the pid-named shard is this process's alone (a given nvme_dir stays)
                shutil.rmtree(self._nvme.path if self.spec.nvme_dir else self._nvme_dir, True)
