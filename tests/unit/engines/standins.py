"""Stand-ins for the adapter's unit tests: a dict page store, a weightless causal LM on
any device, a tiny model geometry and random caches of it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from agentkv_cluster.engines.hf import DynamicCache
from agentkv_cluster.engines.model import LoadedModel
from agentkv_cluster.lifecycle.identity import PageIdentity
from store.types import Lookup

LAYERS, HEADS, DIM, VOCAB = 2, 2, 8, 1000


class DictPageStore:
    """The smallest `PageStore`: bytes in a dict, so a test can change them in place."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, bytearray] = {}

    def put(self, key: bytes, data: bytes | memoryview, identity: PageIdentity) -> None:
        self.blobs.setdefault(key, bytearray(data))

    def get(self, key: bytes) -> tuple[Lookup, bytes | None]:
        blob = self.blobs.get(key)
        return (Lookup.MISS, None) if blob is None else (Lookup.HIT, bytes(blob))

    def delete(self, key: bytes) -> None:
        self.blobs.pop(key, None)

    def __contains__(self, key: bytes) -> bool:
        return key in self.blobs


class StandInModel(torch.nn.Module):
    """A causal LM's interface on ``device``: records the ids it gets, returns zeros."""

    def __init__(self, device: str = "cpu", max_positions: int = 64) -> None:
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=max_positions, vocab_size=VOCAB)
        self.weight = torch.nn.Parameter(torch.zeros(1, device=device))
        self.seen: list[torch.Tensor] = []

    @property
    def dtype(self) -> torch.dtype:  # as transformers' models report it
        return self.weight.dtype

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        self.seen.append(input_ids)
        return SimpleNamespace(logits=torch.zeros(1, input_ids.shape[1], VOCAB,
                                                  device=self.weight.device))


def tiny_loaded(model=None) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, model_version="m@1", tokenizer_version="t",
                       rope_config='{"rope": "default"}', num_layers=LAYERS, kv_heads=HEADS,
                       head_dim=DIM, dtype=torch.float32)


def random_cache(tokens: int, layers: int = LAYERS, dtype=torch.float32, seed: int = 5
                 ) -> DynamicCache:
    gen = torch.Generator().manual_seed(seed)
    return DynamicCache(ddp_cache_data=[
        (torch.randn(1, HEADS, tokens, DIM, generator=gen).to(dtype),
         torch.randn(1, HEADS, tokens, DIM, generator=gen).to(dtype))
        for _ in range(layers)])
