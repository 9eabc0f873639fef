"""A research team: a planner splits a question into topics at run time, one researcher task
per topic runs in parallel, and a writer waits for all of them.

    plait run examples/research_team.py

The LLM is a fake with realistic latencies on the virtual clock, so the run shows real
scheduling in a fraction of a second. Point `backends()` at a real server to use a model.
"""

from __future__ import annotations

import json

from agents import Agent
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

CLOCK = "virtual"

planner = Agent(
    "planner",
    "You split a research question into 3-5 independent topics. "
    "Answer with a JSON list of short topic names.",
    model="llama-3.1-8b",
)
researcher = Agent(
    "researcher",
    "You are a careful researcher. Summarise what is known about the topic in five sentences.",
    model="llama-3.1-8b",
)
writer = Agent("writer", "You write a concise report from your colleagues' notes.",
               model="llama-3.1-8b")  # fmt: skip

QUESTIONS = [
    "How should an agent framework schedule LLM calls on shared GPUs?",
    "What makes KV-cache reuse effective across agent turns?",
]


def fake_reply(request: LLMRequest, hints: Hints) -> str:
    system, prompt = request.messages[0].content, request.messages[-1].content
    if system.startswith("You split"):
        words = [w.strip("?,.").lower() for w in prompt.split() if len(w) > 5]
        return json.dumps(sorted(set(words))[:4])
    if system.startswith("You are a careful researcher"):
        topic = prompt.removeprefix("Topic: ")
        return f"Notes on {topic}: " + " ".join(f"Finding {i} about {topic}." for i in range(5))
    return "Report\n" + "\n".join(line for line in prompt.splitlines() if line.startswith("- "))


def latency(request: LLMRequest) -> float:
    # A rough H100 figure for an 8B model: prefill is cheap, each output token ~10 ms.
    return 0.2 + 0.01 * (request.max_tokens or 200)


def backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=latency, clock=clock)}


def research(question: str, index: int = 0) -> Workflow:
    wf = Workflow(f"research-{index}")

    def spawn(ctx: TaskContext) -> list[str]:
        # The planner's answer decides the shape of the rest of the DAG.
        topics: list[str] = json.loads(ctx.input("plan"))
        for topic in topics:
            ctx.workflow.add(
                f"research:{topic}",
                researcher.ask(f"Topic: {topic}", max_tokens=150),
                before=["write"],
            )
        return topics

    def report_prompt(ctx: TaskContext) -> str:
        notes = [v for k, v in sorted(ctx.inputs.items()) if k.startswith("research:")]
        return f"Question: {question}\nNotes:\n" + "\n".join(f"- {n}" for n in notes)

    wf.add("plan", planner.ask(question, max_tokens=60))
    wf.add("spawn", spawn, after=["plan"])
    wf.add("write", writer.ask(report_prompt, max_tokens=300), after=["spawn"])
    return wf


def workflows() -> list[Workflow]:
    return [research(q, i) for i, q in enumerate(QUESTIONS)]
