"""Checkpoint verification of decoding from a lossy KV restore (paper §5.2).

The lossy working copy drafts greedy tokens; every ``checkpoint_every`` tokens the
full-precision reference copy scores the drafted chunk in one forward pass (as in
speculative decoding). The first token where the reference disagrees is replaced by
the reference's token, the reference cache is cropped to the accepted prefix, and
decoding continues on the reference: the output is exactly the full-precision
greedy output. With no reference copy, the context is recomputed at full precision
(the "recompute entry" fallback).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from agentkv_cluster.engines.hf import drop_cache, prefill, token_list


class VerificationError(ValueError):
    """Bad arguments to the verifier."""


@dataclass(frozen=True, kw_only=True)
class VerifyConfig:
    checkpoint_every: int = 8  # drafted tokens per reference check
    max_new_tokens: int = 64
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.max_new_tokens < 1:
            raise VerificationError("checkpoint_every and max_new_tokens must be >= 1")


@dataclass(slots=True)
class VerifyStats:
    checkpoints: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens the reference confirmed
    rejects: int = 0  # checkpoints that found a divergence
    recomputed_tokens: int = 0  # context tokens re-prefilled because no reference existed
    source: str = "working"  # where the last token came from: working | reference | recompute


@dataclass(frozen=True, kw_only=True)
class VerifiedOutput:
    tokens: tuple[int, ...]
    stats: VerifyStats


def _argmax(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=-1).tolist()


class CheckpointVerifier:
    """Greedy decoding on a working copy, checked against a reference at checkpoints."""

    def __init__(self, model, config: VerifyConfig | None = None) -> None:
        self._model = model
        self._config = config or VerifyConfig()

    def generate(
        self,
        *,
        working: DynamicCache,
        reference: DynamicCache | None,
        context_ids: Sequence[int],
        new_ids: Sequence[int],
    ) -> VerifiedOutput:
        """Decode after ``context_ids`` (held by both caches) and ``new_ids`` (held by neither)."""
        context_ids, new_ids = token_list(context_ids), token_list(new_ids)
        if not new_ids:
            raise VerificationError("new_ids must hold at least one token (the observation)")
        for name, cache in (("working", working), ("reference", reference)):
            if cache is not None and cache.get_seq_length() != len(context_ids):
                raise VerificationError(f"{name} cache holds {cache.get_seq_length()} tokens, "
                                        f"context has {len(context_ids)}")
        stats = VerifyStats()
        if reference is None:
            reference = DynamicCache()
            prefill(self._model, context_ids, reference)
            stats.recomputed_tokens = len(context_ids)
        guess = _argmax(prefill(self._model, new_ids, working)[-1])
        out: list[int] = []
        pending = list(new_ids)  # tokens the reference has not yet consumed
        while len(out) < self._config.max_new_tokens and not self._done(out):
            draft, guess = self._draft(working, guess, len(out))
            verdict = self._check(reference, pending, draft, stats)
            out.extend(verdict)
            if verdict == draft:
                pending = [draft[-1]]
                continue
            stats.rejects += 1
            drop_cache(working)  # the working copy diverged: finish on the reference
            stats.source = "reference" if not stats.recomputed_tokens else "recompute"
            out.extend(self._finish(reference, verdict[-1], len(out)))
            break
        return VerifiedOutput(tokens=tuple(out[: self._config.max_new_tokens]), stats=stats)

    def _done(self, out: list[int]) -> bool:
        return bool(out) and out[-1] == self._config.eos_token_id

    def _draft(self, working: DynamicCache, guess: int, produced: int) -> tuple[list[int], int]:
        """Up to ``checkpoint_every`` greedy tokens from the working copy."""
        budget = min(self._config.checkpoint_every, self._config.max_new_tokens - produced)
        draft: list[int] = []
        while len(draft) < budget:
            draft.append(guess)
            if guess == self._config.eos_token_id or len(draft) == budget:
                break
            guess = _argmax(prefill(self._model, [guess], working)[-1])
        # Feed the last drafted token only if decoding can continue past it.
        if draft[-1] != self._config.eos_token_id and produced + len(draft) < self._config.max_new_tokens:
            guess = _argmax(prefill(self._model, [draft[-1]], working)[-1])
        return draft, guess

    def _check(self, reference: DynamicCache, pending: list[int], draft: list[int],
               stats: VerifyStats) -> list[int]:
        """Tokens to emit: the draft if the reference agrees, else the agreeing prefix plus
        the reference's token at the first disagreement (the reference is cropped to match)."""
        logits = prefill(self._model, pending + draft[:-1], reference)
        preds = _argmax(logits[-len(draft):])
        stats.checkpoints += 1
        stats.drafted += len(draft)
        for j, (want, got) in enumerate(zip(preds, draft)):
            if want != got:
                extra = len(draft) - 1 - j  # reference consumed draft[:-1]; keep draft[:j]
                if extra:
                    reference.crop(-extra)
                stats.accepted += j
                return draft[:j] + [want]
        stats.accepted += len(draft)
        return draft

    def _finish(self, reference: DynamicCache, last: int, produced: int) -> list[int]:
        """Plain greedy decoding on the reference copy after a reject."""
        out: list[int] = []
        tok = last
        while produced + len(out) < self._config.max_new_tokens and tok != self._config.eos_token_id:
            tok = _argmax(prefill(self._model, [tok], reference)[-1])
            out.append(tok)
        return out
