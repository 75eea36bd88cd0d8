"""The agent example's loop: model calls, tool calls with the KV out of the model, resume."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentkv_cluster.engines.hf import (
    AdapterConfig,
    DynamicCache,
    HfKVAdapter,
    StoreReceipt,
    drop_cache,
    prefill,
)
from agentkv_cluster.engines.model import LoadedModel, load_model
from agentkv_cluster.engines.page_store import HostPoolPageStore, PageStore
from examples.agent_events import TENANT, EventSink
from examples.agent_loop import Task, observation_text, parse_call, prompt_text, run_tool
from store.codecs import CodecSpec


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    pool_name: str
    compare: bool = True  # also time a full recompute of the prefill, side by side
    page_tokens: int = 64
    max_line_tokens: int = 24
    pool_slots: int = 96
    progress: bool = False  # show the model loader's progress bars on stderr
    tenant: str = TENANT  # the tenant the pages are named in (the token's, with a service)


@dataclass(slots=True)
class Turn:
    """The running context of one task: tokens, the model's cache and the branch."""

    task_id: str
    tokens: list[int]
    cache: DynamicCache | None
    branch: str = "main"
    calls: int = 0
    receipt: StoreReceipt | None = None  # of the last model call


class AgentRunner:
    def __init__(self, loaded: LoadedModel, store: PageStore, sink: EventSink,
                 config: RunnerConfig, specs: tuple[CodecSpec, ...]) -> None:
        self.loaded, self.store, self.sink, self.config = loaded, store, sink, config
        self.specs = specs
        self.adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=config.page_tokens,
                                                               tenant=config.tenant))
        self._im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")

    @classmethod
    def start(cls, sink: EventSink, config: RunnerConfig,
              store: PageStore | None = None) -> AgentRunner:
        """Load the model; pages go to ``store``, else to a new shared-memory host pool."""
        loaded = load_model(progress=config.progress)
        if store is None:
            slot = config.page_tokens * loaded.kv_bytes_per_token + (64 << 10)
            store = HostPoolPageStore.create(config.pool_name, slot, config.pool_slots)
            specs = (CodecSpec.full(), CodecSpec.int8())  # working copy + compressed form
        else:
            specs = (CodecSpec.full(),)  # the service picks tiers and forms itself
        return cls(loaded, store, sink, config, specs)

    def close(self) -> None:
        if isinstance(self.store, HostPoolPageStore):
            self.store.close()

    def run_task(self, index: int, task: Task) -> bool:
        turn = Turn(task_id=f"task-{index}", tokens=self.loaded.encode(prompt_text(task)),
                    cache=DynamicCache())
        self.sink.send("task_start", turn.task_id, prefix_generation=1)
        print(f"\n== task {index}: {task.goal}")
        t0 = time.perf_counter()
        logits = prefill(self.loaded.model, turn.tokens, turn.cache)[-1]
        print(f"  turn 1: prompt of {len(turn.tokens)} tokens prefilled, "
              f"TTFT {(time.perf_counter() - t0) * 1e3:.0f} ms (cold, nothing stored yet)")
        line = self._generate(turn, logits)
        call = parse_call(line)
        own = call is not None and call[0] == task.tool
        print(f"  model: {line!r} -> {'its own call' if own else 'no usable call: planned'}")
        if task.tool == "search":
            logits = self._explore(turn, task, call[1] if own else line)
        else:
            arg = call[1] if own else task.planned_input
            logits = self._tool_call(turn, task.tool, arg)[0]
        answer = self._generate(turn, logits)
        passed = task.expect.lower() in answer.lower()
        print(f"  answer: {answer!r} -> verification {'passed' if passed else 'failed'}")
        answer_pages = self._model_call(turn)
        if passed:  # the answer's pages become a verified result
            self.sink.send("verification_pass", turn.task_id, call_id=f"v{turn.calls}",
                           branch=turn.branch, pages=answer_pages)
        self.sink.send("task_end", turn.task_id, ok=passed)
        released = self.adapter.release(self.sink.session)
        print(f"  task end: {released} pages released")
        return passed

    def _generate(self, turn: Turn, logits) -> str:
        """Greedy tokens until end of line / end of turn; appended to the context."""
        out = [int(logits.argmax())]
        while (len(out) < self.config.max_line_tokens and out[-1] != self._im_end
               and "\n" not in self.loaded.tokenizer.decode(out[-1:])):
            out.append(int(prefill(self.loaded.model, out[-1:], turn.cache)[-1].argmax()))
        if out[-1] != self._im_end:  # the last token is not in the cache yet
            prefill(self.loaded.model, out[-1:], turn.cache)
        else:
            out.pop()  # never fed to the cache; observation_text() closes the turn itself
        turn.tokens.extend(out)
        return self.loaded.tokenizer.decode(out).strip()

    def _model_call(self, turn: Turn) -> list[int]:
        """Store the context's KV after a model call and report the call with its new pages."""
        turn.calls += 1
        version = self.sink.reserve_version()
        turn.receipt = self.adapter.store(self.sink.session, turn.tokens, turn.cache,
                                          event_version=version, specs=self.specs)
        pages = [_page_id(p.key) for p in turn.receipt.fresh if not p.spec.is_lossy]
        self.sink.send("model_call", turn.task_id, version=version, call_id=f"m{turn.calls}",
                       branch=turn.branch, produces=[[pid, "temp_reasoning"] for pid in pages])
        return pages

    def _tool_call(self, turn: Turn, tool: str, arg: str) -> tuple[object, int]:
        """Store, drop, run the tool, restore, prefill the observation; prints TTFT."""
        self._model_call(turn)
        call_id = f"t{turn.calls}"
        self.sink.send("tool_start", turn.task_id, call_id=call_id, tool=tool, branch=turn.branch)
        drop_cache(turn.cache)  # the model holds no KV while the tool runs
        turn.cache = None
        observation, score = run_tool(tool, arg)
        self.sink.send("observation_return", turn.task_id, call_id=call_id, ok=score > 0)
        return self._resume(turn, f"{tool}({arg!r})", observation), score

    def _resume(self, turn: Turn, label: str, observation: str):
        obs = self.loaded.encode(observation_text(observation))
        t0 = time.perf_counter()
        restored = self.adapter.restore(self.sink.session, turn.tokens)
        logits = prefill(self.loaded.model, obs, restored.cache)[-1]
        ttft = time.perf_counter() - t0
        receipt = turn.receipt
        line = (f"  turn {turn.calls + 1}: {label} -> {observation[:70]!r}\n"
                f"    stored {receipt.written} new pages ({receipt.bytes_written / 2**20:.1f} MiB, "
                f"{'+'.join(s.label for s in self.specs)}); restored "
                f"{restored.restored_tokens} tokens from AgentKV, "
                f"recomputed {restored.recomputed_tokens}; TTFT {ttft * 1e3:.0f} ms")
        if self.config.compare:
            t1 = time.perf_counter()
            prefill(self.loaded.model, turn.tokens + obs, DynamicCache())
            base = time.perf_counter() - t1
            line += f" vs recompute {base * 1e3:.0f} ms ({base / ttft:.1f}x)"
        print(line)
        turn.tokens.extend(obs)
        turn.cache = restored.cache
        return logits

    def _explore(self, turn: Turn, task: Task, own_query: str):
        """Search on two branches (model's query, planned query); roll back the weaker."""
        self._model_call(turn)
        drop_cache(turn.cache)
        turn.cache = None
        results = []
        for name, query in (("model-query", own_query), ("planned-query", task.planned_input)):
            self.sink.send("branch_create", turn.task_id, branch=name, parent="main")
            call_id = f"t{turn.calls}-{name}"
            self.sink.send("tool_start", turn.task_id, call_id=call_id, tool="search",
                           branch=name)
            observation, score = run_tool("search", query)
            self.sink.send("observation_return", turn.task_id, call_id=call_id, ok=score > 0)
            results.append((score, name, query, observation))
        best = max(results, key=lambda r: r[0])
        for score, name, query, _ in results:
            if name != best[1]:
                self.sink.send("rollback", turn.task_id, branch=name)
                print(f"  branch {name} (search {query!r}, score {score}) rolled back")
        turn.branch = best[1]
        return self._resume(turn, f"search({best[2]!r}) on {best[1]}", best[3])


def _page_id(key: bytes) -> int:
    return int.from_bytes(key[:7], "big")
