"""``agentkv serve``: start or join a Ray cluster and serve the wire protocol and metrics.

``--role head`` (default) deploys the whole service on the cluster (a pool actor per
node, an HBM actor per GPU / ``hbm_slot``, the controller) and serves the API;
``--role pool`` / ``--role hbm`` only join the cluster as a worker node offering that
capacity (``hbm_slot`` resource for ``hbm``), which the head then uses.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from agentkv_cluster.cli import CliError

SIZE_HELP = "bytes; units accepted: 16GiB, 512MiB, 4Gi, 1.5GB"


def _env_epilog() -> str:
    from agentkv_cluster.config import env_variables

    lines = ["environment (flags win over these, these over --config):"]
    for name, kind, default in env_variables():
        lines.append(f"  {name:<38} {kind:<6} default {default!r}")
    lines.append("  XDG_STATE_HOME                         path   base of the default --state-dir")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="run the AgentKV service (API + metrics)",
        description="Run the AgentKV service: deploy it on a Ray cluster and serve the wire "
                    "protocol and /metrics, /healthz, /readyz.",
        epilog=_env_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", metavar="ADDR",
                   help="Ray cluster to join (default: start a local Ray)")
    p.add_argument("--redis-url", metavar="URL",
                   help="Redis directory, redis://, rediss:// or unix:// (default: embedded "
                        "directory in the head)")
    p.add_argument("--host", help="API bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="API port (default 7420; 0 picks a free one)")
    p.add_argument("--metrics-port", type=int,
                   help="/metrics, /healthz, /readyz port (default 9420)")
    p.add_argument("--config", type=Path, metavar="FILE", help="YAML config file")
    p.add_argument("--role", choices=("head", "pool", "hbm"),
                   help="head: the whole service (default); pool/hbm: join --address as a "
                        "worker node offering that capacity")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where keys, the token secret, the audit key and log and (unless "
                        "--nvme-dir) NVMe shards persist across restarts (default "
                        "$XDG_STATE_HOME/agentkv, i.e. ~/.local/state/agentkv); one service "
                        "per folder: a second serve on it is refused, naming the first's pid")
    p.add_argument("--pool-bytes", metavar="SIZE", help=f"host pool size per node ({SIZE_HELP})")
    p.add_argument("--nvme-dir", metavar="DIR",
                   help="NVMe shard directory (default: STATE_DIR/nvme); with a local Ray, "
                        "one service per folder, and a warning at start when the file "
                        "system cannot hold --nvme-bytes")
    p.add_argument("--nvme-bytes", metavar="SIZE", help=f"NVMe shard quota ({SIZE_HELP})")
    p.add_argument("--keys-dir", "--tenant-keys-dir", dest="tenant_keys_dir", metavar="DIR",
                   help="tenant key directory, as `agentkv tenant --keys-dir` writes it "
                        "(default STATE_DIR/keys; --tenant-keys-dir is a deprecated alias)")
    p.add_argument("--signing-key", "--audit-key", dest="audit_key", metavar="FILE",
                   help="Ed25519 audit signing key (PEM), as `agentkv tenant --signing-key` "
                        "takes it (default STATE_DIR/audit.key, generated with audit.pub; "
                        "--audit-key is a deprecated alias)")
    p.add_argument("--audit-log", metavar="FILE",
                   help="append-only audit log (default STATE_DIR/audit.log)")
    p.add_argument("--token-secret-file", metavar="FILE",
                   help="file with the token HMAC secret, >= 32 bytes (default "
                        "STATE_DIR/token.secret, generated on first start)")
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
                     "audit_log": args.audit_log, "token_secret_file": args.token_secret_file},
        "state": {"dir": args.state_dir},
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
        raise CliError(f"the token secret in {path} must be at least 32 bytes, it holds "
                       f"{len(secret)}")
    return secret


def _join_worker(cfg: Any) -> int:
    """``--role pool|hbm``: become a Ray worker node of the head's cluster."""
    import subprocess

    if not cfg.ray.address:
        raise CliError("--role pool/hbm needs --address of the head's Ray cluster")
    # The ray next to this Python (a venv's agentkv run without its bin on PATH).
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [str(ray_bin) if ray_bin.exists() else "ray", "start",
           f"--address={cfg.ray.address}", "--block",
           f"--object-store-memory={cfg.ray.object_store_memory}"]
    if cfg.role == "hbm":
        cmd.append(f'--resources={{"{cfg.hbm.resource}": 1}}')
    try:
        return subprocess.call(cmd)
    except FileNotFoundError:
        raise CliError(f"--role {cfg.role}: the `ray` command is not found (install the ray "
                       "extra, or put its bin folder on PATH)") from None


def _on_signals(stop: threading.Event) -> None:
    """SIGTERM (Kubernetes, PID 1) and SIGINT only set ``stop``: the main thread then
    stops the server, the actors and Ray in order. Installed before startup so a
    signal during a slow start still ends in a clean stop."""
    def handler(signum: int, _frame: Any) -> None:
        print(f"agentkv: {signal.Signals(signum).name}, stopping", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def state_dir(cfg: Any) -> Path:
    """The state directory of ``cfg`` (``state.dir``, else ``$XDG_STATE_HOME/agentkv``)."""
    from agentkv_cluster.config import default_state_dir

    # Absolute: what it names must not move with a later chdir, nor read alike for two
    # services started from other folders (the pool's segment name hashes it).
    return Path(os.path.abspath(Path(cfg.state.dir).expanduser() if cfg.state.dir
                                else default_state_dir()))


def prepare_state(cfg: Any) -> Path:
    """Create the state directory (0700) and check every path serve writes, before Ray starts:
    a bad path is a one-line error, not a traceback minutes later."""
    root = state_dir(cfg)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--state-dir {root}: {exc.strerror}") from None
    if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
        raise CliError(f"--state-dir {root} is not a writable directory")
    sec = cfg.security
    keys = Path(sec.tenant_keys_dir) if sec.tenant_keys_dir else root / "keys"
    if keys.exists() and not keys.is_dir():
        raise CliError(f"--keys-dir {keys} is a file, not a directory")
    log_path = Path(sec.audit_log) if sec.audit_log else root / "audit.log"
    if log_path.is_dir():
        raise CliError(f"--audit-log {log_path} is a directory, not a file")
    if not os.access(log_path.parent if not log_path.exists() else log_path, os.W_OK):
        raise CliError(f"--audit-log {log_path} is not writable")
    for flag, value in (("--signing-key", sec.audit_key), ("--token-secret-file",
                                                           sec.token_secret_file)):
        if value and not Path(value).is_file():
            raise CliError(f"{flag} {value} is not a readable file")
    unix = Path(cfg.api.unix_path) if cfg.api.unix_path else None
    if unix is not None and not unix.parent.is_dir():
        raise CliError(f"api.unix_path {unix}: folder {unix.parent} does not exist")
    if not sec.audit_key and not (root / "audit.key").exists() and (root / "audit.pub").exists():
        raise CliError(f"{root / 'audit.pub'} is there without its signing key audit.key: "
                       "a new key pair would replace the public key the receipts signed "
                       "before verify with; move it aside, or give --signing-key")
    if not sec.audit_key:
        check_audit_pair(root / "audit.key", root / "audit.pub")
    return root


def check_audit_pair(private: Path, public: Path) -> None:
    """The state directory's ``audit.pub`` is the public half of its ``audit.key``: serve
    signs with the one and ``agentkv audit verify`` checks with the other by default, so a
    stray public key made every verify fail ("wrong --public-key") while serve ran on.
    Neither file is changed; a pair not there yet is generated later (``audit_signer``)."""
    if not private.exists() or not public.exists():
        return
    from security.errors import InvalidSigningKey
    from security.signing import fingerprint, load_signer, load_verifier

    try:
        signing = load_signer(private).public_raw()
    except InvalidSigningKey as exc:
        raise CliError(f"signing key {private}: {exc}") from None
    try:
        verifying = load_verifier(public).raw
    except InvalidSigningKey as exc:
        raise CliError(f"public key {public}: {exc}") from None
    if signing != verifying:
        raise CliError(f"{public} (key {fingerprint(verifying)}) is not the public key of the "
                       f"signing key {private} (key {fingerprint(signing)}), so `agentkv audit "
                       "verify` would refuse what this service signs: move it aside (receipts "
                       "signed with its key still verify with it) and write the signing key's "
                       f"own: openssl pkey -in {private} -pubout -out {public}")


def token_secret(cfg: Any, root: Path) -> tuple[bytes, str]:
    """The token secret and where it came from: ``--token-secret-file``, else
    ``STATE_DIR/token.secret`` (generated once, 0600), so a restart keeps issued tokens valid."""
    import secrets

    if cfg.security.token_secret_file:
        secret = read_token_secret(cfg.security.token_secret_file)
        assert secret is not None
        return secret, cfg.security.token_secret_file
    path = root / "token.secret"
    if path.exists():
        secret = read_token_secret(str(path))
        assert secret is not None
        return secret, str(path)
    secret = secrets.token_hex(32).encode()
    # Whole or not at all: a crash between creating the file and writing it left an empty
    # secret that every later start refused.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secret + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # never over a secret another start wrote meanwhile
    finally:
        os.unlink(tmp)
    return secret, f"{path} (generated)"


def format_address(address: Any) -> str:
    """``host:port`` (``[v6]:port``) for a TCP address, ``unix:PATH`` for a socket path."""
    if isinstance(address, tuple):
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return f"unix:{address}"


def _watch_directory(cfg: Any, service: Any) -> Any:
    """Probe the Redis directory now and keep watching it (error log + backoff; a restart
    between two probes is seen too). The pools repair their own entries
    (``pool_publisher``): the watch reports, feeds ``agentkv_directory_up``, and after each
    outage or restart erases again what a snapshot may have brought back
    (``ClusterErasure.reapply_directory``). None with the embedded directory (it lives and
    dies with the head)."""
    if not cfg.directory.redis_url:
        return None
    from agentkv_cluster.runtime.directory_glue import RedisSpec
    from agentkv_cluster.runtime.directory_watch import watch_redis

    watch = watch_redis(RedisSpec(url=cfg.directory.redis_url, prefix=cfg.directory.prefix),
                        on_probe=service.metrics.set_directory_up,
                        on_refusal=service.metrics.set_directory_refusal,
                        on_recover=service.erasure.reapply_directory,
                        retry_max_s=cfg.directory.retry_max_s)
    first = watch.probe_once()
    return watch.start(first_wait_s=first)


def _log_to_stderr() -> None:
    """The service's own log lines (nodes placed, failed joins, directory outages) go to
    stderr with the container's other output; library loggers stay at their own levels."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    service_log = logging.getLogger("agentkv_cluster")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from agentkv_cluster.cli._serve_paths import claim_local_paths
    from agentkv_cluster.cli._serve_ports import check_ports

    cfg = config_from_args(args)
    if cfg.role != "head":
        return _join_worker(cfg)
    root = prepare_state(cfg)
    # Before Ray starts: a taken port, a second serve on these folders, an NVMe folder
    # it cannot use or a Redis that refuses the URL's credentials is a one-line error
    # now, not a failure seconds later (or a retry for ever) that names neither the flag
    # nor the cause.
    check_ports(cfg)
    if cfg.directory.redis_url:
        from agentkv_cluster.cli._redis_admin import check_credentials

        check_credentials(cfg.directory.redis_url,
                          "--redis-url" if args.redis_url else "directory.redis_url")
    claim, nvme_warning = claim_local_paths(cfg, root)
    try:
        if nvme_warning:
            print(f"agentkv serve: warning: {nvme_warning}", file=sys.stderr, flush=True)
        return _serve(cfg, root)
    finally:
        claim.release()


def _serve(cfg: Any, root: Path) -> int:
    from agentkv_cluster.runtime.service import Service

    _log_to_stderr()
    secret, secret_from = token_secret(cfg, root)
    service = Service(cfg, workdir=root, token_secret=secret)
    stop = threading.Event()
    _on_signals(stop)
    watch = None
    try:
        try:
            service.start(metrics_http=cfg.metrics.enabled)
        except Exception as exc:  # noqa: BLE001 - startup failures are user-facing here
            raise CliError(f"cannot start the service: {type(exc).__name__}: {exc}") from None
        _on_signals(stop)  # again: ray.init installs its own (aborting) SIGTERM handler
        watch = service.directory_watch = _watch_directory(cfg, service)
        metrics = (f"http://{format_address((cfg.metrics.host, service.http.port))}/metrics"
                   if service.http else "off")
        directory = ("embedded" if watch is None else
                     f"redis {'reachable' if watch.up else 'UNREACHABLE (local-only, retrying)'}")
        print(f"agentkv serving on {format_address(service.address)}\n"
              f"  metrics    {metrics}\n"
              f"  directory  {directory}\n"
              f"  state      {root}\n"
              f"  keys       {service.keys_dir}\n"
              f"  token      {secret_from}", flush=True)
        while not stop.wait(1.0):  # a timed wait keeps the main thread responsive
            pass
    finally:
        service.begin_stop()  # /readyz says 503 now, before the directory watch's stop
        # A second signal while stopping must not cut the cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if watch is not None:
            watch.stop()
        service.stop(shutdown_ray=not cfg.ray.address)
    print("agentkv stopped", flush=True)
    return 0
