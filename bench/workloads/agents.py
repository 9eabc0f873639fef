"""Multi-turn tool-using agents in the style of SWE-bench agents (SWE-agent, OpenHands).

Each program is one agent solving one task: 10-40 turns; every turn sends the whole
conversation (a shared 1-2k-token system prompt, the task, then every earlier reply and
tool result) and ends in a tool call whose result joins the context. Tool pauses are mostly
under a second with a heavy tail (test runs, builds): lognormal body, Pareto tail.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from orchestrator import Message

from ._program import Build, LLMStep, Program, Step, ToolStep, filler, poisson_arrivals

SYSTEM_PROMPTS = 3  # a few agent types share their system prompts


def tool_pause(rng: random.Random, max_pause: float = 60.0) -> float:
    if rng.random() < 0.9:
        return min(rng.lognormvariate(-1.2, 0.8), 5.0, max_pause)  # median 0.3 s
    return min(0.5 * rng.paretovariate(1.3), max_pause)  # the tail: tests, builds, installs


def agent_programs(
    n: int,
    *,
    rate: float,
    seed: int = 0,
    min_turns: int = 10,
    max_turns: int = 40,
    system_tokens: tuple[int, int] = (1000, 2000),
    task_tokens: tuple[int, int] = (150, 600),
    reply_tokens: tuple[int, int] = (60, 400),
    result_tokens: tuple[int, int] = (200, 2500),
    max_pause: float = 60.0,
) -> list[Program]:
    """`n` agents arriving at `rate` a second. Sizes are in the filler's nominal tokens
    (4 characters each); the defaults are the full-size workload, smaller ones fit small
    servers (a real tokenizer may count more tokens than that: check against its limit)."""
    rng = random.Random(seed)
    systems = [
        "You are a software engineering agent. Use the tools to inspect, edit and test code. "
        + filler(random.Random(1000 + k), rng.randint(*system_tokens), f"system-{k}")
        for k in range(SYSTEM_PROMPTS)
    ]
    arrivals = poisson_arrivals(rng, rate, n)
    programs = []
    for i, arrival in enumerate(arrivals):
        system = systems[rng.randrange(SYSTEM_PROMPTS)]
        task = filler(rng, rng.randint(*task_tokens), f"issue-{seed}-{i}")
        turns = rng.randint(min_turns, max_turns)
        steps: list[Step] = []
        replies = [rng.randint(*reply_tokens) for _ in range(turns)]
        results = [filler(rng, rng.randint(*result_tokens), f"tool-{i}-{t}") for t in range(turns)]
        for t in range(turns):
            after = (f"tool{t - 1}",) if t else ()
            steps.append(
                LLMStep(
                    id=f"turn{t}",
                    build=_conversation(system, task, results, t),
                    max_tokens=replies[t],
                    after=after,
                    last=t == turns - 1,
                )
            )
            if t < turns - 1:
                steps.append(ToolStep(f"tool{t}", tool_pause(rng, max_pause), after=(f"turn{t}",)))
        programs.append(Program(f"agent{i}", "agents", arrival, tuple(steps)))
    return programs


def _conversation(system: str, task: str, results: list[str], turn: int) -> Build:
    def build(replies: Mapping[str, str]) -> list[Message]:
        messages = [Message("system", system), Message("user", task)]
        for t in range(turn):
            messages.append(Message("assistant", replies[f"turn{t}"]))
            messages.append(Message("user", results[t]))
        return messages

    return build
