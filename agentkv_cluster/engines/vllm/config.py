"""The connector's settings (``kv_connector_extra_config``) and the engine versions every
block identity carries, derived from vLLM's model config."""

from __future__ import annotations

import hashlib
import json
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentkv_cluster.engines.vllm.blocks import EngineVersions
from agentkv_cluster.engines.vllm.sessions import DEFAULT_MAX_SESSIONS
from security.errors import InvalidName
from security.keyring import PUBLIC_NAMESPACE, validate_namespace

BACKENDS = ("embedded", "service")
LOAD_MODES = ("auto", "async", "layerwise")
STRATEGIES = ("lru", "agentkv")  # the embedded store's eviction
# Settings only one backend reads: given with the other backend they are refused (a
# service_address on an embedded engine, an nvme_dir on a service one, was silently unused).
ONLY_FOR = {"embedded": ("strategy", "host_blocks", "nvme_blocks", "nvme_dir",
                         "token_secret_file", "default_tenant", "prefetch_lead_s",
                         "keys_dir"),
            "service": ("service_address", "service_token", "service_timeout_s",
                        "retry_after_s", "service_max_sessions")}


class ConnectorConfigError(ValueError):
    """A bad ``kv_connector_extra_config`` (the engine refuses to start)."""


@dataclass(frozen=True, kw_only=True)
class EmbeddedSpec:
    """The embedded store (``embedded.py``), built from `ConnectorConfig` in the worker."""

    slot_bytes: int  # one block page (header + KV of all layers)
    host_blocks: int = 256
    nvme_blocks: int = 1024  # 0: no NVMe tier
    nvme_dir: str | None = None  # None: a fresh temporary folder
    strategy: str = "agentkv"
    prefetch_lead_s: float = 1.0  # agentkv: promote before a predicted tool return
    keys_dir: str | None = None  # the service's key directory: its tenant erasures apply

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.host_blocks < 1 or self.nvme_blocks < 0 or self.slot_bytes < 1:
            raise ValueError("host_blocks >= 1, nvme_blocks >= 0 and slot_bytes >= 1")


@dataclass(frozen=True, kw_only=True)
class ConnectorConfig:
    backend: str = "embedded"
    strategy: str = "agentkv"  # embedded: "agentkv" | "lru"
    host_blocks: int = 256
    nvme_blocks: int = 1024
    nvme_dir: str | None = None
    token_secret_file: str | None = None  # embedded: the service's token secret (raw or hex)
    # embedded: the service's key directory (this node's): a tenant's erasure there voids
    # its earlier tokens here, and its blocks are dropped and zeroed
    keys_dir: str | None = None
    default_tenant: str | None = "default"
    service_address: str | None = None  # "host:port" or a unix socket path
    service_token: str | None = None  # for requests that carry no token of their own
    service_timeout_s: float = 5.0
    retry_after_s: float = 5.0  # after a failure, recompute without trying for this long
    service_max_sessions: int = DEFAULT_MAX_SESSIONS  # sessions cached per process (LRU)
    lookup_timeout_s: float = 2.0
    save_queue: int = 256
    # "async": a restored request waits off the step until its blocks are in (get_finished);
    # "layerwise": restored in the step that computes it, each layer copied while the
    # forward runs the layers before it; "auto": async for the service (remote) backend,
    # layerwise for the embedded one (host memory: a step of waiting costs more than it saves)
    load_mode: str = "auto"
    # copies and writes on threads beside the forward ("on"), or between forwards on
    # vLLM's thread ("off"); "auto": on for the service backend (network waits) and where
    # the KV cache is on an accelerator, off for the embedded backend on a CPU-only engine
    # (the forward's OpenMP threads hold every core there)
    background_io: str = "auto"
    min_tail_tokens: int = 16  # save a finished request's partial last block from this size
    hint_socket: str | None = None  # unix socket for hints sent on their own (both backends)
    prefetch_lead_s: float = 1.0  # embedded: promote a paused session this long before
    # its tool is predicted to return (gap learned per tool class)

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> ConnectorConfig:
        extra = dict(extra or {})
        raw = extra.pop("agentkv", None) if "agentkv" in extra else extra
        if not isinstance(raw, dict) or (raw is not extra and extra):
            raise ConnectorConfigError("kv_connector_extra_config holds the AgentKV settings, "
                                       "or a map 'agentkv' of them and nothing else")
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ConnectorConfigError(f"unknown AgentKV connector settings {sorted(unknown)}; "
                                       f"expected some of {sorted(known)}")
        types = typing.get_type_hints(cls)
        for name, value in raw.items():
            _check_type(name, value, types[name])
        cfg = cls(**raw)
        if cfg.backend not in BACKENDS:
            raise ConnectorConfigError(f"backend must be one of {BACKENDS}, got {cfg.backend!r}")
        for backend, names in ONLY_FOR.items():
            unused = sorted(set(names) & set(raw)) if backend != cfg.backend else []
            if unused:
                raise ConnectorConfigError(f"{unused} apply to the {backend} backend only, and "
                                           f"this engine uses the {cfg.backend} one")
        if cfg.load_mode not in LOAD_MODES:
            raise ConnectorConfigError(f"load_mode must be one of {LOAD_MODES}, "
                                       f"got {cfg.load_mode!r}")
        if cfg.background_io not in ("auto", "on", "off"):
            raise ConnectorConfigError("background_io must be one of auto, on, off")
        # Checked here, at the engine's start: the worker's store refused a bad strategy
        # only after the model had loaded, and an infinite timeout failed every call later
        # (an OverflowError, not the service's unavailability).
        if cfg.strategy not in STRATEGIES:
            raise ConnectorConfigError(
                f"strategy must be one of {STRATEGIES}, got {cfg.strategy!r}")
        if cfg.min_tail_tokens < 0 or not 0 <= cfg.prefetch_lead_s < math.inf:  # (NaN too)
            raise ConnectorConfigError("min_tail_tokens and prefetch_lead_s must be >= 0 "
                                       "(and finite)")
        for name in ("host_blocks", "save_queue", "service_timeout_s", "retry_after_s",
                     "lookup_timeout_s", "service_max_sessions"):
            if not 0 < getattr(cfg, name) < math.inf:  # (NaN too)
                raise ConnectorConfigError(
                    f"{name} must be > 0 and finite, got {getattr(cfg, name)!r}")
        if cfg.nvme_blocks < 0:
            raise ConnectorConfigError(f"nvme_blocks must be >= 0, got {cfg.nvme_blocks}")
        if cfg.keys_dir is not None and not os.path.isdir(cfg.keys_dir):
            raise ConnectorConfigError(f"keys_dir {cfg.keys_dir!r:.80} is not a directory "
                                       "(the service's key directory)")
        if cfg.default_tenant is not None:  # token-less requests act as this tenant
            try:
                if validate_namespace(cfg.default_tenant) == PUBLIC_NAMESPACE:
                    raise InvalidName("the PUBLIC namespace is not a tenant: token-less "
                                      "requests would publish without the publish role")
            except InvalidName as exc:
                raise ConnectorConfigError(f"default_tenant: {exc}") from None
        if cfg.backend == "service" and not cfg.service_address:
            raise ConnectorConfigError("the service backend needs service_address")
        if cfg.service_address is not None:
            cfg.address()  # "localhost" (no port) was taken for a socket's file name
        return cfg

    @property
    def async_load(self) -> bool:
        return self.load_mode == "async" or (self.load_mode == "auto"
                                             and self.backend == "service")

    def token_secret(self) -> bytes | None:
        path = self.token_secret_file or os.environ.get("AGENTKV_TOKEN_SECRET_FILE")
        if not path:
            return None
        try:
            data = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ConnectorConfigError(f"token_secret_file {path}: cannot read it "
                                       f"({exc.strerror})") from None
        try:
            return bytes.fromhex(data.decode())
        except (UnicodeDecodeError, ValueError):
            return data

    def address(self) -> tuple[str, int] | str:
        """``service_address`` as (host, port), or a unix socket's path (one with a "/")."""
        assert self.service_address is not None
        host, sep, port = self.service_address.rpartition(":")
        if sep and port.isdigit():
            if not 0 < int(port) < 65536:
                raise ConnectorConfigError(f"service_address {self.service_address!r}: "
                                           "port must be 1..65535")
            return (host or "127.0.0.1", int(port))
        if "/" not in self.service_address:
            raise ConnectorConfigError(f"service_address {self.service_address!r}: give "
                                       "host:port, or a unix socket's path (with a /)")
        return self.service_address


def _check_type(name: str, value: Any, hint: Any) -> None:
    """``value`` is of the setting's declared type (a float setting takes an int too)."""
    allowed = typing.get_args(hint) or (hint,)
    kinds = tuple(type(None) if a is type(None) else a for a in allowed)
    if float in kinds:
        kinds += (int,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
        raise ConnectorConfigError(f"{name} must be {names}, got {value!r:.60}")


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(paths):
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}".encode())
        with p.open("rb") as fh:  # head and tail: cheap, and changes with any re-export
            h.update(fh.read(1 << 20))
            fh.seek(max(0, st.st_size - (1 << 20)))
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def engine_versions(vllm_config: Any) -> EngineVersions:
    """Model (weights + dtype), tokenizer and RoPE versions of the served model."""
    mc = vllm_config.model_config
    folder = Path(mc.model)
    weights = [p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin", ".gguf")] \
        if folder.is_dir() else []
    weights_id = _digest_files(weights) if weights else f"{mc.model}@{mc.revision or ''}"
    model = f"{mc.model}|{weights_id}|dtype={mc.dtype}|kv={vllm_config.cache_config.cache_dtype}"
    tok_dir = Path(mc.tokenizer or mc.model)
    tok_files = [tok_dir / n for n in ("tokenizer.json", "tokenizer.model", "vocab.json")
                 if (tok_dir / n).is_file()]
    tokenizer = "tok-" + (_digest_files(tok_files) if tok_files else str(tok_dir))
    hf = mc.hf_config
    rope = json.dumps({
        "rope": getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None),
        "theta": getattr(hf, "rope_theta", None),
        "head_dim": getattr(hf, "head_dim", None),
        "max_positions": getattr(hf, "max_position_embeddings", None),
    }, sort_keys=True, default=str)
    return EngineVersions(model_version=model, tokenizer_version=tokenizer, rope_config=rope)
