"""Host pool section of ``bench_store.py``: unsealed and sealed puts and gets, in-process and
from another process, each beside the baselines measured in the same run:

  copy 1T   one numpy copy of the same bytes (one core)
  copy MT   the faster of torch ``copy_`` (threads = cores) and a pool of numpy copies
            (one slice per thread, as many threads as cores) of the same bytes
  AES MT    raw ``AESGCM.encrypt_into`` / ``decrypt_into`` of the same bytes split into one
            part per core, on that many threads

Figures are 10th-percentile call times (store_common.fast) over all rounds; one report-only
row per size gives the medians of the same calls. The peer process
attaches to the segment and times its own reads (unsealed: ``read`` into
its buffer; sealed: open the record from the slot straight into its buffer and check the
seqlock); its figures are interleaved round by round with the baselines measured here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from store_common import KIB, MIB, SIZES, aligned, fast, gbps, report, sample_times

from security.chunked import Binding, ChunkedSealer, record_size
from security.keyring import FileKeySource, TenantKeyring
from store.host_pool import HostPool
from store.nvme.format import checksum
from store.parallel import THREADS

UNSEALED_TARGET = 0.9  # of copy MT: put and cross-process get, 2 and 16 MiB
SEALED_RAW_TARGET = 0.8  # of AES MT: sealed put and cross-process get, 16 MiB
SEALED_UNSEALED_TARGET = 0.5  # of the unsealed path, 16 MiB
BINDING = {"tenant": "bench", "generation": 1, "tier": 1, "slot_id": bytes(range(32)),
           "digest": bytes(range(32, 64)), "location": 0}
_PEER_WAIT_S = 300
# torch's OpenMP workers spin on their core for a few milliseconds after each parallel copy
# (GOMP's spin-wait) before they sleep. Each process's rows are timed only after the other
# process's workers went to sleep: otherwise the timed copies share a core with a spinning
# thread of the bench itself (the peer's 2 MiB gets fell to 11-12 GB/s, one core's speed,
# against 24 GB/s after the pause; quiet box, 2026-12-01). The NIXL section pauses alike.
_SETTLE_S = 0.05
# Figures the NIXL section compares against: size -> seconds of an unsealed cross-process get.
XPROC_GET: dict[int, float] = {}


class Baselines:
    """The copies and raw AES-GCM every row is measured against, on the same buffers."""

    def __init__(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.src, self.dst = src, dst
        n = src.shape[0]
        self.gcm, self.nonce = AESGCM(os.urandom(32)), os.urandom(12)
        self.parts = [(i * (n // THREADS), n // THREADS if i < THREADS - 1
                       else n - (THREADS - 1) * (n // THREADS)) for i in range(THREADS)]
        self.sealed = aligned(n + 16 * THREADS)
        self.pool = ThreadPoolExecutor(THREADS)
        self.tsrc, self.tdst = torch.from_numpy(src), torch.from_numpy(dst)

    def numpy_threads(self) -> None:
        n, k = self.src.shape[0], THREADS
        step = -(-n // k)
        list(self.pool.map(lambda i: np.copyto(self.dst[i * step:(i + 1) * step],
                                               self.src[i * step:(i + 1) * step]), range(k)))

    def torch_copy(self) -> None:
        self.tdst.copy_(self.tsrc)

    def _aes(self, i: int, decrypt: bool) -> None:
        off, n = self.parts[i]
        ct = self.sealed[off + 16 * i: off + 16 * i + n + 16]
        if decrypt:
            self.gcm.decrypt_into(self.nonce, ct, b"", self.dst[off:off + n])
        else:
            self.gcm.encrypt_into(self.nonce, self.src[off:off + n], b"", ct)

    def aes(self, decrypt: bool) -> None:
        if THREADS == 1:
            self._aes(0, decrypt)
            return
        list(self.pool.map(lambda i: self._aes(i, decrypt), range(THREADS)))

    def close(self) -> None:
        self.pool.shutdown()


def _peer(conn, shm: str, keys_dir: str, size: int) -> None:
    """The reading process: attaches to the pool and times the gets it is asked for."""
    torch.set_num_threads(THREADS)
    try:
        pool = HostPool.attach(shm)
    except OSError as exc:
        conn.send(("error", repr(exc)))
        return
    conn.send(("ready", ""))
    sealer = ChunkedSealer(TenantKeyring(FileKeySource(keys_dir)))
    binding = Binding(**BINDING)
    out = aligned(size)

    def sealed_get(slot: int) -> None:
        view, seq = pool.view(slot)
        sealer.open_into(view, binding, out)
        if not pool.unchanged(slot, seq):
            raise RuntimeError("the bench never rewrites a slot while it is read")

    while (cmd := conn.recv()) is not None:
        op, slot, reps = cmd
        if op == "get":
            t = sample_times(lambda s=slot: pool.read(s, out=out), reps)
        else:
            t = sample_times(lambda s=slot: sealed_get(s), reps)
        conn.send((t, checksum(out[:size])))
    pool.close()


def _peer_seconds(conn, command: tuple[str, int, int], digest: int) -> list[float]:
    """The reading process's timed reads for ``command``, each batch between two pauses
    (``_SETTLE_S``); checks that it read the bytes with ``digest``."""
    time.sleep(_SETTLE_S)
    conn.send(command)
    if not conn.poll(_PEER_WAIT_S):
        raise RuntimeError("the reading process stopped answering")
    seconds, got = conn.recv()
    time.sleep(_SETTLE_S)
    assert got == digest, "the peer read other bytes"
    return seconds


def bench_host_pool(rounds: int) -> None:
    """Unsealed and sealed rows for every size; targets at 2 and 16 MiB (sealed: 16 MiB)."""
    keys_dir = tempfile.mkdtemp(prefix="akv-bench-keys-")
    try:
        ring = TenantKeyring(FileKeySource(keys_dir))
        ring.create_tenant("bench")
        for size in SIZES:
            med, typical = _measure(size, rounds, ChunkedSealer(ring), keys_dir)
            XPROC_GET[size] = med["xget"]
            _rows(size, med, typical)
    finally:
        shutil.rmtree(keys_dir, ignore_errors=True)  # no key files left behind in /tmp


def _measure(size: int, rounds: int, sealer: ChunkedSealer, keys_dir: str
             ) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of each row and baseline at one size, interleaved round by round: the 10th
    percentile of every call (what the targets are checked on), and the median."""
    binding = Binding(**BINDING)
    ctx = mp.get_context("spawn")
    # not "akv-*": a pytest session ending meanwhile removes the akv-* segments it saw appear
    name = f"bench-store-host-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    pool = HostPool.create(name, record_size(size), 2)
    src, dst = aligned(size, fill=True), aligned(size)
    base = Baselines(src, dst)
    here, there = ctx.Pipe()
    peer = ctx.Process(target=_peer, args=(there, name, keys_dir, size), daemon=True)
    peer.start()
    try:
        if not here.poll(_PEER_WAIT_S):
            raise RuntimeError("the reading process did not start")
        status, detail = here.recv()
        if status != "ready":
            raise RuntimeError(f"the reading process failed: {detail}")
        plain_slot, sealed_slot = pool.alloc(), pool.alloc()
        pool.write(plain_slot, src)

        def sealed_put() -> None:  # reserve -> seal in place -> commit
            view = pool.reserve(sealed_slot, pool.slot_bytes)
            pool.commit(sealed_slot, sealer.seal_into(view, src, binding))

        def sealed_get() -> None:
            sealer.open_into(pool.view(sealed_slot)[0], binding, dst)

        sealed_put()
        reps = max(5, (64 * MIB) // size)
        torch.set_num_threads(THREADS)

        digest = checksum(src)

        def remote(op: str, slot: int) -> list[float]:
            return _peer_seconds(here, (op, slot, reps), digest)

        rows = {
            "copy1": lambda: np.copyto(dst, src),
            "numpy_mt": base.numpy_threads,
            "torch_mt": base.torch_copy,
            "aes_enc": lambda: base.aes(False),
            "aes_dec": lambda: base.aes(True),
            "put": lambda: pool.write(plain_slot, src),
            "get": lambda: pool.read(plain_slot, out=dst),
            "xget": None,
            "sput": sealed_put,
            "sget": sealed_get,
            "xsget": None,
        }
        t: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(rounds):  # interleaved so drift hits every row alike
            for key, fn in rows.items():
                if fn is not None:
                    t[key] += sample_times(fn, reps)
                else:
                    t[key] += remote("get" if key == "xget" else "sealed",
                                     plain_slot if key == "xget" else sealed_slot)
        assert bytes(pool.read(plain_slot, out=dst)) == src.tobytes()
        return ({k: fast(v) for k, v in t.items()},
                {k: statistics.median(v) for k, v in t.items()})
    finally:
        here.send(None)
        peer.join(timeout=30)
        base.close()
        pool.close()
        pool.unlink()


def _rows(size: int, med: dict[str, float], typical: dict[str, float]) -> None:
    label = f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"
    mt = min(med["numpy_mt"], med["torch_mt"])  # the faster multi-threaded copy
    big = size >= 2 * MIB
    report("host_pool", f"copy 1T / MT {label}",
           f"1T {gbps(size, med['copy1']):5.2f}, numpy {gbps(size, med['numpy_mt']):5.2f}, "
           f"torch {gbps(size, med['torch_mt']):5.2f} GB/s ({THREADS} threads)",
           med["copy1"] / mt, None)
    report("host_pool", f"  medians {label}", " ".join(
        f"{k} {gbps(size, typical[k]):.2f}" for k in ("copy1", "numpy_mt", "torch_mt", "put",
                                                      "xget", "sput", "xsget")) + " GB/s",
           None, None)
    report("host_pool", f"AES-GCM MT {label}",
           f"enc {gbps(size, med['aes_enc']):5.2f}, dec {gbps(size, med['aes_dec']):5.2f} GB/s"
           f" ({THREADS} threads)", None, None)
    vs_mt = f"vs copy MT {gbps(size, mt):5.2f} GB/s"
    for key, case, target in (("put", "put", UNSEALED_TARGET if big else None),
                              ("get", "get (same process)", None),
                              ("xget", "get (other process)", UNSEALED_TARGET if big else None)):
        report("host_pool", f"{case} {label}", f"{gbps(size, med[key]):5.2f} GB/s {vs_mt} "
               f"(x{med['numpy_mt'] / med[key]:.2f} of the numpy pool)", mt / med[key], target)
    sixteen = size >= 16 * MIB
    for key, plain, raw, case in (("sput", "put", "aes_enc", "sealed put"),
                                  ("sget", "get", "aes_dec", "sealed get (same process)"),
                                  ("xsget", "xget", "aes_dec", "sealed get (other process)")):
        strict = sixteen and key != "sget"
        report("host_pool", f"{case} {label}",
               f"{gbps(size, med[key]):5.2f} GB/s vs AES MT {gbps(size, med[raw]):5.2f} GB/s",
               med[raw] / med[key], SEALED_RAW_TARGET if strict else None)
        report("host_pool", f"  {case} vs unsealed {label}",
               f"{gbps(size, med[key]):5.2f} GB/s vs {gbps(size, med[plain]):5.2f} GB/s",
               med[plain] / med[key], SEALED_UNSEALED_TARGET if strict else None)




class HostReader:
    """A host pool holding one page and a reading process that times its gets of it (the
    NIXL section runs it beside its transfers)."""

    def __init__(self, src: np.ndarray) -> None:
        self.size = src.shape[0]
        self.digest = checksum(src)
        self.keys_dir = tempfile.mkdtemp(prefix="akv-bench-keys-")
        self.name = f"bench-store-host-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.pool = HostPool.create(self.name, self.size, 1)
        self.slot = self.pool.alloc()
        self.pool.write(self.slot, src)
        ctx = mp.get_context("spawn")
        self._conn, there = ctx.Pipe()
        self._peer = ctx.Process(target=_peer, args=(there, self.name, self.keys_dir,
                                                     self.size), daemon=True)
        self._peer.start()
        if not self._conn.poll(_PEER_WAIT_S) or self._conn.recv()[0] != "ready":
            self.close()
            raise RuntimeError("the reading process did not start")

    def get_seconds(self, reps: int) -> list[float]:
        return _peer_seconds(self._conn, ("get", self.slot, reps), self.digest)

    def close(self) -> None:
        if self._peer.is_alive():
            self._conn.send(None)
            self._peer.join(timeout=30)
        self.pool.close()
        self.pool.unlink()
        shutil.rmtree(self.keys_dir, ignore_errors=True)


__all__ = ["XPROC_GET", "HostReader", "bench_host_pool"]
