"""Quality of restored KV on the real model: teacher-forced agreement, KL and perplexity.

One context is prefilled, stored as pages in each codec, restored, and the next
tokens are teacher-forced on top of the restored cache. Each codec is compared with
the uninterrupted full-precision run over the same continuation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import DynamicCache

from agentkv_cluster.engines.hf import HfKVAdapter, drop_cache, prefill
from store.codecs import CodecSpec

_REPO = Path(__file__).resolve().parents[2]
PAPER = _REPO.parent / "shared" / "docs" / "PAPER.md"


@dataclass(frozen=True, kw_only=True)
class QualityRow:
    """One codec against the uninterrupted full-precision run."""

    label: str
    bytes_ratio: float  # stored page bytes / full-precision page bytes
    top1: float  # fraction of positions whose argmax token matches
    kl: float  # mean KL(reference || restored), nats per position
    ppl: float
    ppl_change: float  # ppl / reference ppl - 1
    max_abs_logit: float

    @property
    def lossless(self) -> bool:
        return self.max_abs_logit == 0.0


def context_text() -> tuple[str, str]:
    """Real text for contexts: the paper digest in ../shared, else this repo's docs."""
    if PAPER.is_file():
        return PAPER.read_text(), str(PAPER)
    docs = sorted((_REPO / "docs").glob("*.md")) + [_REPO / "README.md"]
    return "\n\n".join(p.read_text() for p in docs if p.is_file()), f"{_REPO.name}/docs/*.md"


def _metrics(ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> tuple[float, ...]:
    ref64, got64 = ref.double(), got.double()
    logp_ref = torch.log_softmax(ref64, dim=-1)
    logp_got = torch.log_softmax(got64, dim=-1)
    kl = (logp_ref.exp() * (logp_ref - logp_got)).sum(-1).mean().item()
    top1 = (ref64.argmax(-1) == got64.argmax(-1)).double().mean().item()
    n = targets.numel()
    nll_ref = -logp_ref[:n].gather(-1, targets[:, None]).mean().item()
    nll_got = -logp_got[:n].gather(-1, targets[:, None]).mean().item()
    return top1, kl, math.exp(nll_ref), math.exp(nll_got), (got - ref).abs().max().item()


def measure_quality(
    adapter: HfKVAdapter,
    model,
    context_ids: Sequence[int],
    continuation_ids: Sequence[int],
    specs: Sequence[CodecSpec],
    session: str = "quality",
) -> list[QualityRow]:
    """Store the context in every form of ``specs``, restore each, teacher-force the
    continuation and compare with the uninterrupted run."""
    cache = DynamicCache()
    prefill(model, context_ids, cache)
    receipt = adapter.store(session, context_ids, cache, event_version=1,
                            specs=(CodecSpec.full(), *specs))
    ref = prefill(model, continuation_ids, cache)  # the uninterrupted run
    drop_cache(cache)
    sizes: dict[str, int] = {}
    for page in receipt.pages:
        sizes[page.spec.label] = sizes.get(page.spec.label, 0) + page.nbytes
    targets = torch.tensor(list(continuation_ids[1:]), dtype=torch.long)
    rows = []
    for spec in specs:
        restored = adapter.restore(session, context_ids, spec=spec, recompute=False)
        if restored.restored_tokens != len(context_ids):
            raise RuntimeError(f"{spec.label}: only {restored.restored_tokens} tokens resident")
        got = prefill(model, continuation_ids, restored.cache)
        drop_cache(restored.cache)
        top1, kl, ppl_ref, ppl, max_abs = _metrics(ref, got, targets)
        rows.append(QualityRow(label=spec.label, bytes_ratio=sizes[spec.label] / sizes["full"],
                               top1=top1, kl=kl, ppl=ppl, ppl_change=ppl / ppl_ref - 1,
                               max_abs_logit=max_abs))
    return rows
