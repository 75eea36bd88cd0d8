"""A real tool-using agent loop on SmolLM2-135M whose KV leaves the model during tool calls.

Each model call's KV is stored as pages (full precision + INT8) in the shared-memory
host pool and dropped from the model while the tool runs; when the observation
returns, the cache is restored from the pool (longest resident prefix + recompute of
the rest) and decoding resumes. The eight workflow events go to AgentKV: to a running
service through the Python client with ``--connect``, else to an in-process event
graph (the lifecycle code the service runs); with ``--service`` a service is started here
(its actors in-process, or on a local Ray with ``--ray``) and both events and pages
go through its Python client over the wire protocol. Time to first token is printed per turn,
beside a full recompute of the prefill.

Tools are real: a calculator and a search over this repository's docs. The 135M
model often fails to produce a well-formed tool call; the orchestrator then runs the
task's planned call and says so ("planned"). Search questions are explored on two
branches (the model's query and the planned one); the branch with the weaker hit is
rolled back before its observation reaches the model, so only the winner's tokens
are prefilled on top of the restored KV.

    .venv/bin/python examples/agent_loop.py [--service [--ray] | --connect HOST:PORT --token T]
                                            [--no-compare] [--progress]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.agent_events import TENANT, local_sink, service_sink
from examples.agent_tools import ToolError, calculator, search_docs

SYSTEM = (
    "You are an agent with two tools. To use one, reply with exactly one line:\n"
    "CALL calculator: <arithmetic expression>\n"
    "CALL search: <words to look up in the project docs>\n"
    "After an observation, reply with one line: ANSWER: <answer>"
)
FEW_SHOT = [
    ("user", "Task: What is 3 * (4 + 5)?"),
    ("assistant", "CALL calculator: 3 * (4 + 5)"),
    ("user", "Observation: 27"),
    ("assistant", "ANSWER: 27"),
    ("user", "Task: Which library does the project use for progress bars?"),
    ("assistant", "CALL search: library progress bars"),
    ("user", "Observation: Long work shows a rich progress bar (from STYLE.md, line 12)"),
    ("assistant", "ANSWER: rich"),
]


@dataclass(frozen=True, kw_only=True)
class Task:
    goal: str
    tool: str  # the tool the task needs
    planned_input: str  # what the orchestrator runs if the model's call is unusable
    expect: str  # the answer must contain this to pass verification


TASKS = (
    Task(goal="What is 17 * 23 + 4?", tool="calculator", planned_input="17 * 23 + 4",
         expect="395"),
    Task(goal="Which inference engine does AgentKV integrate through a KV connector?",
         tool="search", planned_input="vLLM KV connector integration", expect="vLLM"),
)


def _turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def prompt_text(task: Task) -> str:
    shots = "".join(_turn(role, text) for role, text in FEW_SHOT)
    return _turn("system", SYSTEM) + shots + _turn("user", f"Task: {task.goal}") + \
        "<|im_start|>assistant\n"


def observation_text(text: str) -> str:
    return "<|im_end|>\n" + _turn("user", f"Observation: {text}") + "<|im_start|>assistant\n"


def parse_call(line: str) -> tuple[str, str] | None:
    """("calculator"|"search", argument) from ``CALL tool: arg``, else None."""
    head, _, arg = line.strip().partition(":")
    parts = head.split()
    if len(parts) == 2 and parts[0] == "CALL" and parts[1] in ("calculator", "search") and arg.strip():
        return parts[1], arg.strip()
    return None


def run_tool(tool: str, arg: str) -> tuple[str, int]:
    """Observation text and a score (0 = the tool found nothing / failed)."""
    if tool == "calculator":
        try:
            return calculator(arg), 1
        except ToolError as exc:
            return f"error: {exc}", 0
    hit = search_docs(arg)
    if hit is None:
        return "no match", 0
    text = hit.text.replace("**", "").replace("`", "")
    return f"{text} (from {hit.path}, line {hit.line})", hit.score


def _connect(args) -> tuple[object, object, str]:
    """(service or None, client, description) for --service / --connect."""
    from agentkv_cluster.api.client import AgentKvClient
    from examples.agent_service import start_local_service

    if args.service:
        service, client = start_local_service(TENANT, ray=args.ray)
        where = "on a local Ray" if args.ray else "in this process, no Ray"
        return service, client, f"AgentKV service ({where}) at {service.address} via the client"
    host, sep, port = args.connect.rpartition(":")
    target = (host, int(port)) if sep and port.isdigit() else args.connect
    return None, AgentKvClient.connect(target, args.token), f"AgentKV at {args.connect} (client)"


def _stop(service, client, ray: bool) -> None:
    if client is not None:
        client.close()
    if service is not None:
        service.stop(shutdown_ray=ray)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where_to = ap.add_mutually_exclusive_group()
    where_to.add_argument("--service", action="store_true",
                          help="start an AgentKV service here and go through its client")
    ap.add_argument("--ray", action="store_true",
                    help="with --service: deploy its actors on a local Ray (else in-process)")
    where_to.add_argument("--connect", help="HOST:PORT (or a unix socket path) of `agentkv serve`")
    ap.add_argument("--token", help="bearer token for --connect (its tenant owns the pages)")
    ap.add_argument("--no-compare", action="store_true", help="skip the recompute baseline")
    ap.add_argument("--progress", action="store_true",
                    help="show the model loader's progress bars on stderr")
    args = ap.parse_args(argv)
    if args.ray and not args.service:
        ap.error("--ray only applies with --service")
    if args.connect and not args.token:
        ap.error("--connect needs --token (a bearer token of the service)")

    from agentkv_cluster.api.protocol import RemoteError
    from agentkv_cluster.engines.page_store import ServicePageStore
    from examples.agent_runner import AgentRunner, RunnerConfig

    service = client = None
    config = RunnerConfig(compare=not args.no_compare, progress=args.progress,
                          pool_name=f"agentkv-example-{os.getpid()}")
    if args.service or args.connect:
        target = args.connect or "the service started here"
        try:
            service, client, where = _connect(args)
            session = client.open_session("agent-1")
        except (OSError, RemoteError) as exc:  # nothing listens there, or a refused token
            what = "cannot reach" if isinstance(exc, OSError) else "refused by"
            print(f"agent_loop: {what} AgentKV at {target}: {exc}", file=sys.stderr)
            _stop(service, client, args.ray)
            return 2
        # Pages are named in the token's tenant: the service refuses any other namespace.
        config = replace(config, tenant=session.opened.get("tenant", TENANT))
        sink = service_sink(session, where)
        runner = AgentRunner.start(sink, config, store=ServicePageStore(session))
        print(f"events and KV pages -> {where}")
    else:
        sink = local_sink()
        runner = AgentRunner.start(sink, config)
        print(f"events -> {sink.describe()}; KV pages -> shared-memory host pool (HostPool)")
    t0 = time.perf_counter()
    try:
        results = [runner.run_task(i, task) for i, task in enumerate(TASKS)]
    finally:
        runner.close()
        _stop(service, client, args.ray)
    print(f"\nevents sent: {sink.counts()}")
    print(f"tasks passed verification: {sum(results)}/{len(results)} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0 if len(sink.counts()) == 8 else 1


if __name__ == "__main__":
    raise SystemExit(main())
