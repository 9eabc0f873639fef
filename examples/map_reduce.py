"""Map-reduce over many inputs: one summariser call per document, then one reducer.

    plait run examples/map_reduce.py

The documents share the summariser's system prompt, a natural shared prefix.
"""

from __future__ import annotations

from agents import Agent
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

CLOCK = "virtual"
DOCUMENTS = [f"Quarterly report {i}: revenue grew {i % 7} percent." for i in range(40)]

summariser = Agent("summariser", "Summarise the document in one sentence.", max_tokens=40)
reducer = Agent("reducer", "Combine the summaries into one paragraph.", max_tokens=200)


def fake_reply(request: LLMRequest, hints: Hints) -> str:
    text = request.messages[-1].content
    if request.messages[0].content.startswith("Summarise"):
        return "Summary: " + text.split(":", 1)[-1].strip()
    return f"{text.count('Summary:')} summaries combined."


def backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=0.5, clock=clock)}


def map_reduce(documents: list[str], name: str = "map-reduce") -> Workflow:
    wf = Workflow(name)
    for i, document in enumerate(documents):
        wf.add(f"map{i}", summariser.ask(document))

    def combine(ctx: TaskContext) -> str:
        ordered = [ctx.inputs[f"map{i}"] for i in range(len(documents))]
        return "\n".join(ordered)

    wf.add("reduce", reducer.ask(combine), after=[f"map{i}" for i in range(len(documents))])
    return wf


def workflows() -> list[Workflow]:
    return [map_reduce(DOCUMENTS)]
