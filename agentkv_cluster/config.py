"""Service configuration: one frozen dataclass per component, one root, one loader.

Values come, lowest precedence first, from the dataclass defaults, a YAML file
(sections named like the root's fields), ``AGENTKV_<SECTION>_<FIELD>`` environment
variables, and explicit overrides (the command line). Every validation error names
the dotted field it is about, so an operator can fix the right line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv_cluster.config_checks import ConfigError, validate
from agentkv_cluster.config_sizes import FRAME_ENVELOPE_BYTES  # noqa: F401 - imported from here

log = logging.getLogger(__name__)

ENV_PREFIX = "AGENTKV_"


@dataclass(frozen=True, kw_only=True)
class ApiConfig:
    host: str = "127.0.0.1"
    port: int = 7420
    unix_path: str | None = None
    max_frame_bytes: int = 64 << 20
    read_timeout_s: float = 30.0
    max_connections: int = 256
    workers: int = 64  # backend calls block (restores, credit waits): one thread each
    # Of those, one tenant's calls hold at most this many at once (0: half of ``workers``);
    # its others wait their turn without a thread (releases and closes excepted), so one
    # tenant's loads blocked on room, or its slow lookups, cannot starve the others.
    tenant_workers: int = 0
    # Authenticated connections one tenant may hold (0: half of ``max_connections``).
    tenant_connections: int = 0
    require_auth: bool = True


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    host: str = "127.0.0.1"
    port: int = 9420
    enabled: bool = True
    # The first N tenants seen since start keep a label of their own; later ones share
    # "_other", which no tenant name can be (a label never moves to another tenant, so
    # series stay continuous).
    top_tenants: int = 20
    # False: tenants are labelled by a stable blinded id (t-<hex>); True: by their names.
    tenant_names: bool = False


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    address: str | None = None  # None: start a local Ray
    namespace: str = "agentkv"
    object_store_memory: int = 256 << 20
    num_cpus: int | None = None


@dataclass(frozen=True, kw_only=True)
class DirectoryConfig:
    redis_url: str | None = None  # None: embedded directory hosted by the head
    prefix: str = "akv"
    # While Redis is unreachable the head retries after 0.5 s, doubling up to this.
    retry_max_s: float = 30.0


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    pool_bytes: int = 512 << 20
    slot_bytes: int = 4 << 20
    nvme_dir: str | None = None  # None: a temporary folder
    nvme_bytes: int = 4 << 30
    fsync: bool = False
    # Tombstones (8 KiB each) of space held back beside each NVMe shard, outside nvme_bytes,
    # so a full disk still deletes and erases; 0 = none (config_sizes checks 0..65536).
    nvme_reserve_tombstones: int = 32  # store.nvme.NvmeShardConfig's default


@dataclass(frozen=True, kw_only=True)
class HbmConfig:
    page_bytes: int = 4 << 20
    num_pages: int = 64
    device: str | None = None  # None: cuda when available, else cpu
    resource: str = "hbm_slot"  # custom resource on CPU-only nodes
    # Arena pages beyond num_pages held ready for one-hop restores (runtime/landing.py).
    landing_pages: int = 8


@dataclass(frozen=True, kw_only=True)
class CreditConfig:
    per_link: int = 4  # concurrent restores over one node-to-node or tier link
    per_session: int = 2  # a session's share of a link while others wait (alone: all of it)
    max_wait_s: float = 2.0  # after this a waiter is offered a lower precision


@dataclass(frozen=True, kw_only=True)
class SecurityConfig:
    tenant_keys_dir: str | None = None  # None: generated in a temporary folder
    audit_key: str | None = None
    audit_log: str | None = None
    token_secret_file: str | None = None  # None: a random per-process secret


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    policy: str = "agentkv"
    tick_s: float = 0.05
    hbm_budget_fraction: float = 0.35
    idle_session_s: float = 86400.0  # an open session unused this long is closed (0: never)


@dataclass(frozen=True, kw_only=True)
class StateConfig:
    # Keys, token secret, audit key and log, NVMe shards unless set elsewhere.
    # None: $XDG_STATE_HOME/agentkv (~/.local/state/agentkv).
    dir: str | None = None


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/agentkv``, or ``~/.local/state/agentkv`` (XDG base directories)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agentkv"


@dataclass(frozen=True, kw_only=True)
class AgentKvConfig:
    role: str = "head"
    api: ApiConfig = field(default_factory=ApiConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    directory: DirectoryConfig = field(default_factory=DirectoryConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    hbm: HbmConfig = field(default_factory=HbmConfig)
    credits: CreditConfig = field(default_factory=CreditConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    state: StateConfig = field(default_factory=StateConfig)


_SECTIONS: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(AgentKvConfig)
    if f.name != "role"
}


_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
               "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
               "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20,
               "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40}
_SIZE_RE = re.compile(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str | int) -> int:
    """Bytes from ``16GiB``, ``512MiB``, ``4Gi``, ``1.5GB``, ``4096`` or ``0x1000``.

    Binary units (KiB, MiB, GiB, TiB; also Ki, Mi, Gi, Ti as Kubernetes writes them) are
    powers of 1024, decimal ones (kB, MB, GB, TB) powers of 1000. ValueError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    raw = text if isinstance(text, str) else repr(text)
    if raw.strip().lower().startswith("0x"):
        return int(raw.strip(), 16)
    m = _SIZE_RE.fullmatch(raw)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {raw!r} (e.g. 16GiB, 512MiB, 4096)")
    value = float(m.group(1).replace("_", "")) * _SIZE_UNITS[unit]
    if not math.isfinite(value):  # int(inf) is an OverflowError, not a ValueError
        raise ValueError(f"not a size: {raw!r} (too large)")
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {raw!r}")
    return int(value)


def env_variables() -> list[tuple[str, str, Any]]:
    """Every ``AGENTKV_*`` variable the loader reads: (name, type name, default)."""
    out: list[tuple[str, str, Any]] = [(f"{ENV_PREFIX}ROLE", "str", AgentKvConfig.role)]
    for section, cls in _SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            kind = "size" if _is_size(section, f.name) else (args[0] if args else hint).__name__
            out.append((f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}", kind, f.default))
    return out


def _is_size(section: str, name: str) -> bool:
    return name.endswith("_bytes") or name == "object_store_memory"


def nvme_root(cfg: AgentKvConfig, workdir: Path) -> Path:
    """The folder every pool's NVMe shard lives under: ``pool.nvme_dir``, else
    ``WORKDIR/nvme``."""
    return Path(cfg.pool.nvme_dir) if cfg.pool.nvme_dir else workdir / "nvme"


# The lowest value of each numeric setting: (bound, whether the bound itself is allowed).
def _coerce(name: str, hint: Any, raw: Any) -> Any:
    """Convert a YAML or environment value to the field's declared type."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        if raw is None or (isinstance(raw, str) and raw.lower() in ("", "none", "null")):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(name, f"expected a boolean, got {raw!r}")
    if hint is int and _is_size(*name.rpartition(".")[::2]):
        try:
            return parse_size(raw)
        except ValueError as exc:
            raise ConfigError(name, str(exc)) from None
    if hint in (int, float):
        if isinstance(raw, bool):
            raise ConfigError(name, f"expected {hint.__name__}, got {raw!r}")
        try:
            return hint(raw) if hint is float else int(str(raw).replace("_", ""), 0)
        except (TypeError, ValueError):
            raise ConfigError(name, f"expected {hint.__name__}, got {raw!r}") from None
    if hint is str:
        if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
            raise ConfigError(name, f"expected a string, got {raw!r}")
        return str(raw)
    raise ConfigError(name, f"unsupported type {hint!r}")  # pragma: no cover


def _build_section(section: str, cls: type, values: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, raw in values.items():
        if key not in known:
            raise ConfigError(f"{section}.{key}", "unknown field")
        kwargs[key] = _coerce(f"{section}.{key}", hints[key], raw)
    return cls(**kwargs)


# AGENTKV_* variables that are not settings, each read where it acts.
NOT_SETTINGS = frozenset({
    "AGENTKV_REDIS_PASSWORD", "AGENTKV_TOKEN_SECRET_FILE",  # secrets, kept out of files
    "AGENTKV_NIXL_LANES", "AGENTKV_NIXL_PROGRESS_US", "AGENTKV_COPY_THREADS",
    "AGENTKV_HUGE_PAGES", "AGENTKV_TORCH_THREADS",  # byte-path tuning (docs/architecture.md)
    "AGENTKV_VLLM_STATS", "AGENTKV_VLLM_MODEL", "AGENTKV_CONFIGS",  # tests and benchmarks
})


def _env_values(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX):].lower()
        if rest == "role":
            out.setdefault("", {})["role"] = raw
            continue
        section, _, attr = rest.partition("_")
        if section not in _SECTIONS:  # other AGENTKV_* variables are not settings, but a
            if key not in NOT_SETTINGS:  # misspelled section was silently ignored
                log.warning("%s is not a setting (no section %r; sections: %s): ignored",
                            key, section, ", ".join(_SECTIONS))
            continue
        if not attr:
            raise ConfigError(key, "names no field")
        out.setdefault(section, {})[attr] = raw
    return out


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError("config", f"{path} is not a text (YAML) file") from None
    except yaml.YAMLError as exc:  # one line naming the file and where (str(exc) is several)
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError("config", f"{path} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping at top level")
    return data


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> AgentKvConfig:
    """Defaults < YAML file < ``AGENTKV_*`` env < ``overrides`` (e.g. CLI flags)."""
    merged: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    role: Any = AgentKvConfig.role
    layers: list[Mapping[str, Any]] = []
    if path is not None:
        layers.append(_read_yaml(path))
    env_layer: dict[str, Any] = dict(_env_values(os.environ if env is None else env))
    if "" in env_layer:
        env_layer["role"] = env_layer.pop("")["role"]
    layers.append(env_layer)
    if overrides:
        layers.append(overrides)
    for layer in layers:
        for section, values in layer.items():
            if section == "role":
                role = values
                continue
            if section not in _SECTIONS:
                raise ConfigError(section, "unknown section")
            if not isinstance(values, Mapping):
                raise ConfigError(section, "must be a mapping")
            merged[section].update({k: v for k, v in values.items() if v is not None}
                                   if layer is overrides else values)
    sections = {name: _build_section(name, cls, merged[name]) for name, cls in _SECTIONS.items()}
    return validate(AgentKvConfig(role=_coerce("role", str, role), **sections))
