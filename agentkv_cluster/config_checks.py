"""Range and consistency checks of a loaded configuration (``validate``), and the error
every bad setting raises, naming it."""

from __future__ import annotations

import dataclasses
import math
import urllib.parse
from typing import TYPE_CHECKING

from agentkv_cluster.config_sizes import size_conflicts

if TYPE_CHECKING:
    from agentkv_cluster.config import AgentKvConfig

ROLES = ("head", "pool", "hbm")
POLICIES = ("agentkv", "lru")


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


# Every number in the tree must also be finite, checked once for all in validate() (NaN
# compares false with everything, so a bound alone would let it through).
_BOUNDS: dict[str, tuple[int, bool]] = {
    **{name: (0, False) for name in (
        "api.read_timeout_s", "api.max_connections", "api.workers", "metrics.top_tenants",
        "pool.pool_bytes", "pool.slot_bytes", "pool.nvme_bytes", "hbm.page_bytes",
        "hbm.num_pages", "credits.per_link", "credits.per_session", "credits.max_wait_s",
        "controller.tick_s", "directory.retry_max_s")},
    # Ray's own floor (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES), refused here
    # rather than by ray.init after the checks passed
    "ray.object_store_memory": (75 << 20, True),
    "api.max_frame_bytes": (1024, True),
    "hbm.landing_pages": (0, True),
    "api.tenant_workers": (0, True),
    "api.tenant_connections": (0, True),
    "controller.idle_session_s": (0, True),
    "ray.num_cpus": (0, True),  # unset: ray_start.LOCAL_RAY_CPUS for a local Ray
}


def _numbers(cfg: AgentKvConfig) -> dict[str, float]:
    """Every numeric setting that is set: dotted name -> value (booleans are not numbers)."""
    out: dict[str, float] = {}
    for sec in dataclasses.fields(cfg):
        part, section = getattr(cfg, sec.name), sec.name
        if not dataclasses.is_dataclass(part):
            continue  # (the role)
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{section}.{f.name}"] = value
    return out


def _check_number(name: str, value: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value!r}")
    bound = _BOUNDS.get(name)
    if bound is not None and (value < bound[0] or (value == bound[0] and not bound[1])):
        raise ConfigError(name, f"must be {'>=' if bound[1] else '>'} {bound[0]}, got {value!r}")


def validate(cfg: AgentKvConfig) -> AgentKvConfig:
    """Range checks across the tree; returns ``cfg`` unchanged when valid."""
    if cfg.role not in ROLES:
        raise ConfigError("role", f"must be one of {ROLES}, got {cfg.role!r}")
    for name, value in _numbers(cfg).items():
        _check_number(name, value)
    for share, total, what in (("tenant_workers", "workers", "threads"),
                               ("tenant_connections", "max_connections", "connections")):
        if getattr(cfg.api, share) > getattr(cfg.api, total):  # a tenant's share of them
            raise ConfigError(f"api.{share}", f"must be at most api.{total} "
                              f"({getattr(cfg.api, total)}), got {getattr(cfg.api, share)}: "
                              f"one tenant cannot hold more {what} than there are (0: half "
                              "of them)")
    for name, port in (("api.port", cfg.api.port), ("metrics.port", cfg.metrics.port)):
        if not 0 <= port <= 65535:  # 0 asks the OS for a free port
            raise ConfigError(name, f"must be 0..65535, got {port}")
    conflicts = size_conflicts(cfg)  # a page must fit a wire frame, a pool slot, the shard
    if conflicts:
        raise ConfigError(conflicts[0].field, conflicts[0].message)
    if cfg.controller.policy not in POLICIES:
        raise ConfigError("controller.policy", f"must be one of {POLICIES}")
    if not 0 < cfg.controller.hbm_budget_fraction <= 1:
        raise ConfigError("controller.hbm_budget_fraction", "must be in (0, 1]")
    if cfg.directory.redis_url is not None:
        _check_redis_url(cfg.directory.redis_url)
    return cfg


_NO_VERIFY = {"ssl_cert_reqs": ("none", "optional"),
              "ssl_check_hostname": ("0", "f", "false", "n", "no", "off")}


def _check_redis_url(url: str) -> None:
    """A redis://, rediss:// or unix:// URL whose TLS, if any, verifies the server (the
    URL holds the directory's password: no message repeats it)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError("directory.redis_url", "not a redis URL: it must start with "
                          f"redis://, rediss:// or unix:// (it starts {scheme or 'otherwise'!r})")
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number (0..65535)
    except ValueError:
        raise ConfigError("directory.redis_url", "its port is not a number in 0..65535"
                          ) from None
    query = urllib.parse.parse_qs(parts.query)
    for option, off in _NO_VERIFY.items():
        if any(v.strip().lower() in off for v in query.get(option, [])):
            raise ConfigError("directory.redis_url", f"its {option} option turns off the "
                              "verification of the Redis server's TLS certificate: remove it "
                              "and name the CA that signed it with ssl_ca_certs=PATH")
