"""Multi-turn tool-using agents in the style of SWE-bench agents (SWE-agent, OpenHands).

Each program is one agent solving one task: 10-40 turns; every turn sends the whole
conversation (a shared 1-2k-token system prompt, the task, then every earlier reply and
tool result) and ends in a tool call whose result joins the context. Tool pauses are mostly
under a second with a heavy tail (test runs, builds): lognormal body, Pareto tail.
"""

from __future__ import annotations

import functools
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


CORPUS_TOKENS = 200_000


@functools.cache
def _corpus() -> str:
    return filler(random.Random(0xC0), CORPUS_TOKENS, "corpus")


def _text(topic: str, offset: int, tokens: int) -> str:
    """About `tokens` tokens of filler behind its own tag (so no two texts share a block)."""
    head = f"[{topic}] "
    return (head + _corpus()[offset : offset + tokens * 4])[: tokens * 4]


def many_agent_programs(
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
    """`agent_programs` of the same shapes and sizes, cheap enough for tens of thousands.

    A program's task and tool results are slices of one shared corpus behind tags of their
    own, made when its first call needs them and dropped after its last: 10,000 programs
    are generated in seconds and hold only the texts of those running, where
    `agent_programs` takes a minute and a half and holds 1.4 GB of text."""
    rng = random.Random(seed)
    systems = [
        "You are a software engineering agent. Use the tools to inspect, edit and test code. "
        + filler(random.Random(1000 + k), rng.randint(*system_tokens), f"system-{k}")
        for k in range(SYSTEM_PROMPTS)
    ]
    room = CORPUS_TOKENS * 4 - 4 * max(task_tokens[1], result_tokens[1])
    arrivals = poisson_arrivals(rng, rate, n)
    programs = []
    for i, arrival in enumerate(arrivals):
        system = systems[rng.randrange(SYSTEM_PROMPTS)]
        task = (f"issue-{seed}-{i}", rng.randrange(room), rng.randint(*task_tokens))
        turns = rng.randint(min_turns, max_turns)
        replies = [rng.randint(*reply_tokens) for _ in range(turns)]
        results = [
            (f"tool-{i}-{t}", rng.randrange(room), rng.randint(*result_tokens))
            for t in range(turns)
        ]
        texts = _Texts(task, results)
        steps: list[Step] = []
        for t in range(turns):
            last = t == turns - 1
            steps.append(
                LLMStep(
                    id=f"turn{t}",
                    build=_lazy_conversation(system, texts, t, last),
                    max_tokens=replies[t],
                    after=(f"tool{t - 1}",) if t else (),
                    last=last,
                )
            )
            if not last:
                steps.append(ToolStep(f"tool{t}", tool_pause(rng, max_pause), after=(f"turn{t}",)))
        programs.append(Program(f"agent{i}", "agents", arrival, tuple(steps)))
    return programs


class _Texts:
    """One program's task and tool results, made on first use and dropped after its last
    call (made again, the same, if a call is built once more); and its latest messages,
    which the next turn extends."""

    def __init__(self, task: tuple[str, int, int], results: list[tuple[str, int, int]]) -> None:
        self._task = task
        self._results = results
        self._made: tuple[str, list[str]] | None = None
        self.latest: tuple[int, list[Message]] = (-1, [])

    def get(self) -> tuple[str, list[str]]:
        if self._made is None:
            self._made = (_text(*self._task), [_text(*spec) for spec in self._results])
        return self._made

    def drop(self) -> None:
        self._made = None
        self.latest = (-1, [])


def _lazy_conversation(system: str, texts: _Texts, turn: int, last: bool) -> Build:
    def build(replies: Mapping[str, str]) -> list[Message]:
        task, results = texts.get()
        done, earlier = texts.latest
        if done == turn - 1 and turn > 0:
            messages = [*earlier, Message("assistant", replies[f"turn{turn - 1}"])]
            messages.append(Message("user", results[turn - 1]))
        else:
            messages = [Message("system", system), Message("user", task)]
            for t in range(turn):
                messages.append(Message("assistant", replies[f"turn{t}"]))
                messages.append(Message("user", results[t]))
        texts.latest = (turn, messages)
        if last:
            texts.drop()
        return list(messages)

    return build
