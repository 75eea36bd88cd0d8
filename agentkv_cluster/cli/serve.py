"""``agentkv serve``: start or join a Ray cluster and serve the wire protocol and metrics.

``--role head`` (default) deploys the whole service on the cluster (a pool actor per
node, an HBM actor per GPU / ``hbm_slot``, the controller) and serves the API;
``--role pool`` / ``--role hbm`` only join the cluster as a worker node offering that
capacity (``hbm_slot`` resource for ``hbm``), which the head then uses.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the AgentKV service (API + metrics)")
    p.add_argument("--address", help="Ray cluster to join (default: start a local Ray)")
    p.add_argument("--redis-url", help="Redis directory (default: embedded directory)")
    p.add_argument("--host", help="API bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="API port (default 7420)")
    p.add_argument("--metrics-port", type=int, help="metrics/health port (default 9420)")
    p.add_argument("--config", type=Path, help="YAML config file")
    p.add_argument("--role", choices=("head", "pool", "hbm"), help="what this process runs")
    p.add_argument("--pool-bytes", type=int, help="host pool bytes per node")
    p.add_argument("--nvme-dir", help="NVMe shard directory")
    p.add_argument("--nvme-bytes", type=int, help="NVMe shard quota in bytes")
    p.add_argument("--tenant-keys-dir", help="tenant key directory (FileKeySource)")
    p.add_argument("--audit-key", help="audit signing key file")
    p.add_argument("--token-secret-file", help="file with the token HMAC secret (>= 32 bytes)")
    p.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """Flags override env, env overrides the YAML file: one loader does it all."""
    from agentkv_cluster.config import ConfigError, load_config

    overrides = {
        "role": args.role,
        "ray": {"address": args.address},
        "directory": {"redis_url": args.redis_url},
        "api": {"host": args.host, "port": args.port},
        "metrics": {"port": args.metrics_port},
        "pool": {"pool_bytes": args.pool_bytes, "nvme_dir": args.nvme_dir,
                 "nvme_bytes": args.nvme_bytes},
        "security": {"tenant_keys_dir": args.tenant_keys_dir, "audit_key": args.audit_key,
                     "token_secret_file": args.token_secret_file},
    }
    if args.role is None:
        del overrides["role"]
    try:
        return load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def read_token_secret(path: str | None) -> bytes | None:
    """The token HMAC secret of ``--token-secret-file`` (also used by ``agentkv tenant token``)."""
    if path is None:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise CliError(f"cannot read token secret {path}: {exc.strerror}") from None
    if len(secret) < 32:
        raise CliError("the token secret must be at least 32 bytes")
    return secret


def _join_worker(cfg: Any) -> int:
    """``--role pool|hbm``: become a Ray worker node of the head's cluster."""
    import subprocess

    if not cfg.ray.address:
        raise CliError("--role pool/hbm needs --address of the head's Ray cluster")
    cmd = ["ray", "start", f"--address={cfg.ray.address}", "--block",
           f"--object-store-memory={cfg.ray.object_store_memory}"]
    if cfg.role == "hbm":
        cmd.append(f'--resources={{"{cfg.hbm.resource}": 1}}')
    return subprocess.call(cmd)


def service_secret(service: Any) -> bytes:
    return service.token_secret


def _on_signals(stop: threading.Event) -> None:
    """SIGTERM (Kubernetes, PID 1) and SIGINT only set ``stop``: the main thread then
    stops the server, the actors and Ray in order. Installed before startup so a
    signal during a slow start still ends in a clean stop."""
    def handler(signum: int, _frame: Any) -> None:
        print(f"agentkv: {signal.Signals(signum).name}, stopping", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.role != "head":
        return _join_worker(cfg)
    from agentkv_cluster.runtime.service import Service

    # The service's own log lines (nodes placed, failed joins) go to stderr with the
    # container's other output; library loggers stay at their own levels.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    service_log = logging.getLogger("agentkv_cluster")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
    secret = read_token_secret(cfg.security.token_secret_file)
    service = Service(cfg, token_secret=secret)
    if secret is None:  # tokens must be issuable by the operator: keep the secret on disk
        path = service.workdir / "token.secret"
        path.write_bytes(service_secret(service))
        path.chmod(0o600)
        print(f"no --token-secret-file: generated {path}", flush=True)
    stop = threading.Event()
    _on_signals(stop)
    try:
        try:
            service.start(metrics_http=cfg.metrics.enabled)
        except Exception as exc:  # noqa: BLE001 - startup failures are user-facing here
            raise CliError(f"cannot start the service: {type(exc).__name__}: {exc}") from None
        _on_signals(stop)  # again: ray.init installs its own (aborting) SIGTERM handler
        metrics = f"{cfg.metrics.host}:{service.http.port}" if service.http else "off"
        print(f"agentkv serving on {service.address}; metrics on {metrics}", flush=True)
        while not stop.wait(1.0):  # a timed wait keeps the main thread responsive
            pass
    finally:
        # A second signal while stopping must not cut the cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        service.stop(shutdown_ray=not cfg.ray.address)
    print("agentkv stopped", flush=True)
    return 0
