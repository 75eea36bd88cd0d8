"""Quality of restored KV on the real model: teacher-forced agreement, KL and perplexity.

A context is prefilled, stored as pages in each codec, restored, and the next tokens
are teacher-forced on top of the restored cache; each codec is compared with the
uninterrupted full-precision run over the same continuation. `measure_windows`
repeats this over disjoint windows of a text and averages.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from agentkv_cluster.engines.hf import HfKVAdapter, drop_cache, prefill
from store.codecs import CodecSpec

_REPO = Path(__file__).resolve().parents[2]
PAPER = _REPO.parent / "shared" / "docs" / "PAPER.md"


@dataclass(frozen=True, kw_only=True)
class WindowStats:
    """Sums over one window's positions (so windows can be pooled exactly)."""

    label: str
    positions: int
    agree: int  # positions whose argmax matches the reference
    kl_sum: float
    nll_sum: float
    nll_ref_sum: float
    targets: int
    max_abs_logit: float
    nbytes: int
    full_nbytes: int


@dataclass(frozen=True, kw_only=True)
class QualityRow:
    """One codec against the uninterrupted full-precision run, pooled over windows."""

    label: str
    windows: int
    bytes_ratio: float  # stored page bytes / full-precision page bytes
    top1: float  # share of positions whose argmax token matches
    top1_min: float  # worst single window
    kl: float  # mean KL(reference || restored), nats per position
    ppl: float
    ppl_ref: float
    ppl_change: float  # ppl / ppl_ref - 1
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


def row_labels(specs: Sequence[CodecSpec]) -> dict[CodecSpec, str]:
    """A distinct row name per form: its label, with the group size where two forms
    share a label (INT4 at group 32 and at group 64 are two rows, not one)."""
    specs = tuple(dict.fromkeys(specs))
    seen = Counter(spec.label for spec in specs)
    return {spec: spec.label if seen[spec.label] == 1 else f"{spec.label}-g{spec.group_size}"
            for spec in specs}


def _window(label, ref, got, targets, nbytes, full_nbytes) -> WindowStats:
    logp_ref = torch.log_softmax(ref.double(), dim=-1)
    logp_got = torch.log_softmax(got.double(), dim=-1)
    n = targets.numel()
    return WindowStats(
        label=label, positions=ref.shape[0],
        agree=int((ref.argmax(-1) == got.argmax(-1)).sum()),
        kl_sum=float((logp_ref.exp() * (logp_ref - logp_got)).sum()),
        nll_sum=float(-logp_got[:n].gather(-1, targets[:, None]).sum()),
        nll_ref_sum=float(-logp_ref[:n].gather(-1, targets[:, None]).sum()),
        targets=n, max_abs_logit=float((got - ref).abs().max()),
        nbytes=nbytes, full_nbytes=full_nbytes)


def measure_window(
    adapter: HfKVAdapter,
    model,
    context_ids: Sequence[int],
    continuation_ids: Sequence[int],
    specs: Sequence[CodecSpec],
    session: str = "quality",
) -> list[WindowStats]:
    """Store the context in every form of ``specs``, restore each, teacher-force the
    continuation and compare with the uninterrupted run. Releases the pages after.
    Each distinct form gives one `WindowStats`, named by `row_labels`."""
    labels = row_labels(specs)
    cache = DynamicCache()
    prefill(model, context_ids, cache)
    receipt = adapter.store(session, context_ids, cache, event_version=1,
                            specs=(CodecSpec.full(), *specs))
    ref = prefill(model, continuation_ids, cache)  # the uninterrupted run
    drop_cache(cache)
    sizes: dict[CodecSpec, int] = {}
    for page in receipt.pages:
        sizes[page.spec] = sizes.get(page.spec, 0) + page.nbytes
    targets = torch.tensor(list(continuation_ids[1:]), dtype=torch.long, device=ref.device)
    out = []
    try:
        for spec, label in labels.items():
            restored = adapter.restore(session, context_ids, spec=spec, recompute=False)
            if restored.restored_tokens != len(context_ids):
                raise RuntimeError(f"{spec.label}: only {restored.restored_tokens} tokens resident")
            got = prefill(model, continuation_ids, restored.cache)
            drop_cache(restored.cache)
            out.append(_window(label, ref, got, targets, sizes[spec], sizes[CodecSpec.full()]))
    finally:
        adapter.release(session)
    return out


def measure_windows(
    adapter: HfKVAdapter,
    model,
    token_ids: Sequence[int],
    specs: Sequence[CodecSpec],
    *,
    context: int = 512,
    continuation: int = 256,
    max_windows: int = 4,
    progress=None,
) -> list[QualityRow]:
    """`measure_window` over up to ``max_windows`` disjoint windows of ``token_ids``, pooled.

    ``progress`` (optional) is called with no arguments after each window.
    """
    span = context + continuation
    count = min(max_windows, len(token_ids) // span)
    if count < 1:
        raise ValueError(f"need at least {span} tokens, got {len(token_ids)}")
    per_label: dict[str, list[WindowStats]] = {}
    for w in range(count):
        ids = token_ids[w * span:(w + 1) * span]
        for stats in measure_window(adapter, model, ids[:context], ids[context:], specs,
                                    session=f"quality-{w}"):
            per_label.setdefault(stats.label, []).append(stats)
        if progress is not None:
            progress()
    return [_pool(label, windows) for label, windows in per_label.items()]


def _pool(label: str, windows: list[WindowStats]) -> QualityRow:
    positions = sum(w.positions for w in windows)
    targets = sum(w.targets for w in windows)
    ppl = math.exp(sum(w.nll_sum for w in windows) / targets)
    ppl_ref = math.exp(sum(w.nll_ref_sum for w in windows) / targets)
    return QualityRow(
        label=label, windows=len(windows),
        bytes_ratio=sum(w.nbytes for w in windows) / sum(w.full_nbytes for w in windows),
        top1=sum(w.agree for w in windows) / positions,
        top1_min=min(w.agree / w.positions for w in windows),
        kl=sum(w.kl_sum for w in windows) / positions,
        ppl=ppl, ppl_ref=ppl_ref, ppl_change=ppl / ppl_ref - 1,
        max_abs_logit=max(w.max_abs_logit for w in windows))
