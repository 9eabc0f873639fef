"""A durable pipeline: crash it, then resume it with nothing lost and no call paid twice.

An analyst agent reads three sources (a tool call and an LLM call each), a function adds one
summary task per source while the run goes on, and an editor joins them. Every task's code
is at the top of this module, so a resumed run finds it again by name.

    plait run examples/durable_pipeline.py --store runs.db       # CRASH=1 to kill it midway
    plait resume examples/durable_pipeline.py --store runs.db --dry-run
    plait resume examples/durable_pipeline.py --store runs.db

With CRASH=1 the process kills itself (os._exit, as SIGKILL would) once the summaries are
done; `plait resume` then keeps every finished task and runs the rest.
"""

from __future__ import annotations

import os

from agents import Agent, Tool
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

SOURCES = ("vllm docs", "sglang paper", "dynamo blog")

analyst = Agent("analyst", "You extract the key claim of a source in one sentence.")
editor = Agent("editor", "You merge notes into a short brief.")


def fetch(source: str) -> str:
    """A stand-in for a search or HTTP tool."""
    return f"text of the {source}"


fetch_tool = Tool("fetch", fetch, "Fetch a source's text")


def reply(request: LLMRequest, hints: Hints) -> str:
    prompt = request.messages[-1].content
    return f"[{request.messages[0].content.split()[1]}] {prompt[:60]}"


def backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(reply, latency=0.2)}


def summary_prompt(ctx: TaskContext) -> str:
    (text,) = ctx.inputs.values()
    return f"Key claim of: {text}"


def brief_prompt(ctx: TaskContext) -> str:
    notes = [v for k, v in sorted(ctx.inputs.items()) if k.startswith("summary")]
    return "Merge: " + " | ".join(notes)


def plan(ctx: TaskContext) -> int:
    """Adds a summary per fetched source while the run goes on (a run-time mutation)."""
    for i, _ in enumerate(SOURCES):
        ctx.workflow.add(
            f"summary {i}",
            analyst.ask(summary_prompt),
            after=[f"fetch {i}"],
            before=["checkpoint", "brief"],
        )
    return len(SOURCES)


def crash_once(ctx: TaskContext) -> str:
    if os.environ.get("CRASH") == "1":
        print("CRASH=1: killing the process now", flush=True)
        os._exit(137)
    return "went on"


def pipeline(name: str = "brief") -> Workflow:
    wf = Workflow(name)
    for i, source in enumerate(SOURCES):
        wf.add(f"fetch {i}", fetch_tool.call({"source": source}))
    wf.add("plan", plan, after=[f"fetch {i}" for i in range(len(SOURCES))])
    wf.add("brief", editor.ask(brief_prompt), after=["plan"])
    wf.add("checkpoint", crash_once, after=["plan"])
    wf.add_edge("checkpoint", "brief")
    return wf


def workflows() -> list[Workflow]:
    return [pipeline()]
