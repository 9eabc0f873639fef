"""A research team: a planner splits a question into topics at run time, one researcher task
per topic runs in parallel, and a writer waits for all of them.

    plait run examples/research_team.py

By default the team runs on the simulated H100 serving Llama-3.1-8B, in virtual time, as
plait.toml beside this file says (`CONFIG`): the timings, batching and prefix caching are
those of the simulated GPU, and the run takes a fraction of a second. The simulator's text
is noise, so the planner's answer is read as a list of topic words when it is not JSON.
`fake_backends()` answers with readable text instead (the tests use it); to use a real model,
point a config file at a real server (plait.toml shows a vLLM router) and pass it with
`plait run examples/research_team.py --config my.toml`.

Every task's code is at the top level of this module (the question travels as a tool call's
argument, not in a closure), so a run recorded with `--store` can be resumed by name.
"""

from __future__ import annotations

import json

from agents import Agent, Tool
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

CLOCK = "virtual"
CONFIG = "plait.toml"  # the backends and limits; `plait run --config` picks another

planner = Agent(
    "planner",
    "You split a research question into 3-5 independent topics. "
    "Answer with a JSON list of short topic names.",
    model="llama-3.1-8b",
)
researcher = Agent(
    "researcher",
    "You are a careful researcher. Summarise what is known about the topic in five "
    "sentences, citing the sources you rely on. " * 8,  # a long shared prefix, as in practice
    model="llama-3.1-8b",
)
writer = Agent("writer", "You write a concise report from your colleagues' notes.",
               model="llama-3.1-8b")  # fmt: skip

QUESTIONS = [
    "How should an agent framework schedule LLM calls on shared GPUs?",
    "What makes KV-cache reuse effective across agent turns?",
    "When does prefix-aware routing beat round-robin over replicas?",
    "How long should a server keep a paused agent's KV cache?",
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


def fake_backends(clock: Clock) -> dict[str, LLMBackend]:
    # A rough H100 figure for an 8B model: prefill is cheap, each output token ~10 ms.
    def latency(request: LLMRequest) -> float:
        return 0.2 + 0.01 * (request.max_tokens or 200)

    return {"default": FunctionLLM(fake_reply, latency=latency, clock=clock)}


def topics_from(reply: str) -> list[str]:
    """The planner's topics: its JSON list, or else its first distinct words (3 to 5)."""
    try:
        parsed = json.loads(reply)
        if isinstance(parsed, list) and parsed:
            return [str(t) for t in parsed][:5]
    except json.JSONDecodeError:
        pass
    words = list(dict.fromkeys(w for w in reply.split() if w.isalpha()))
    return (words or ["general"])[: max(3, min(5, len(words)))]


def given(question: str) -> str:
    """The research question, as a task's result: the tasks after it read it from there."""
    return question


question_tool = Tool("question", given, "The research question")


def spawn(ctx: TaskContext) -> list[str]:
    """The planner's answer decides the shape of the rest of the DAG: a researcher per topic."""
    question = ctx.input("question")
    topics = topics_from(ctx.input("plan"))
    for topic in topics:
        ctx.workflow.add(
            f"research:{topic}",
            researcher.ask(f"Topic: {topic}\nQuestion: {question}", max_tokens=150),
            before=["write"],
        )
    return topics


def report_prompt(ctx: TaskContext) -> str:
    notes = [v for k, v in sorted(ctx.inputs.items()) if k.startswith("research:")]
    return f"Question: {ctx.input('question')}\nNotes:\n" + "\n".join(f"- {n}" for n in notes)


def research(question: str, index: int = 0) -> Workflow:
    wf = Workflow(f"research-{index}")
    wf.add("question", question_tool.call({"question": question}))
    wf.add("plan", planner.ask(question, max_tokens=40))
    wf.add("spawn", spawn, after=["plan", "question"])
    wf.add("write", writer.ask(report_prompt, max_tokens=300), after=["spawn", "question"])
    return wf


def workflows() -> list[Workflow]:
    return [research(q, i) for i, q in enumerate(QUESTIONS)]
