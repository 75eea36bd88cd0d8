"""Joining or starting Ray for the service: a ``host:port`` address is checked first, and
the process's own signal handlers outlive ``ray.init``."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from agentkv_cluster.config import AgentKvConfig


def _ray():
    import ray

    return ray


def start_ray(cfg: AgentKvConfig) -> None:
    """Join ``cfg.ray.address`` or start a small local Ray."""
    ray = _ray()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    # ray.init installs its own SIGTERM handler (a stack dump, then abort): the rest of a
    # start (the actors, a minute) keeps the process's own, so a pod stopped while it
    # starts still stops cleanly.
    kept = _signal_handlers()
    try:
        if cfg.ray.address:
            _check_reachable(cfg.ray.address)
            ray.init(address=cfg.ray.address, namespace=cfg.ray.namespace, log_to_driver=False)
        else:
            ray.init(**local_ray_args(cfg))
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # (only the main thread may set them)
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)
            if signal.getsignal(s) is not None}


RAY_CONNECT_S = 10.0


def _check_reachable(address: str) -> None:
    """A ``host:port`` Ray address must accept a connection: ``ray.init`` retried an
    unreachable one for minutes, saying nothing of its own (only GCS warnings)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address or not host:
        return  # "auto", ray://...: Ray resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        raise RuntimeError(f"the Ray cluster at {address} is not reachable ({exc.strerror or exc}"
                           f" within {RAY_CONNECT_S:g} s): check --address / ray.address, and "
                           "that its head is up") from None


LOCAL_RAY_CPUS = 4  # a local Ray's CPU count when ray.num_cpus is unset


def local_ray_args(cfg: AgentKvConfig) -> dict[str, Any]:
    """``ray.init`` arguments for a local Ray. Every AgentKV actor asks for 0 CPUs, so
    ``ray.num_cpus: 0`` is honoured as given (it leaves no CPUs for other Ray work)."""
    cpus = LOCAL_RAY_CPUS if cfg.ray.num_cpus is None else cfg.ray.num_cpus
    # address="local": never attach to some other Ray found on this machine.
    return {"address": "local", "namespace": cfg.ray.namespace,
            "object_store_memory": cfg.ray.object_store_memory, "num_cpus": cpus,
            "resources": {cfg.hbm.resource: 1}, "include_dashboard": False,
            "log_to_driver": False}
