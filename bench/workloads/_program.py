"""The shape every workload shares: programs of dependent LLM and tool steps."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator import Message

Build = Callable[[Mapping[str, str]], list[Message]]


@dataclass(frozen=True, slots=True)
class LLMStep:
    id: str
    build: Build
    """Messages of this call, from the replies of the steps before it (by step id)."""
    max_tokens: int
    after: tuple[str, ...] = ()
    last: bool = False
    """The program's last LLM call."""
    order: int = 0
    """Position in the job's input: a naive client sends ready calls in this order."""


@dataclass(frozen=True, slots=True)
class ToolStep:
    id: str
    seconds: float
    after: tuple[str, ...] = ()
    tool: str = "tool"


@dataclass(frozen=True, slots=True)
class TraceStep:
    """An LLM call known only by its lengths and prefix blocks (a replayed trace)."""

    id: str
    prompt_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...]
    """One id per `block_tokens` tokens of the prompt; equal ids mean equal prefixes."""
    block_tokens: int
    after: tuple[str, ...] = ()


Step = LLMStep | ToolStep | TraceStep


@dataclass(frozen=True, slots=True)
class Program:
    id: str
    kind: str
    arrival: float
    steps: tuple[Step, ...]
    deadline: float | None = None
    """Seconds after arrival by which the program should be done, if it has a deadline."""
    meta: dict[str, float] = field(default_factory=dict)

    @property
    def llm_calls(self) -> int:
        return sum(isinstance(s, LLMStep) for s in self.steps)


def poisson_arrivals(rng: random.Random, rate: float, n: int, start: float = 0.0) -> list[float]:
    """`n` arrival times of a Poisson process of `rate` per second."""
    t = start
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def filler(rng: random.Random, tokens: int, topic: str) -> str:
    """Deterministic text of about `tokens` tokens (4 characters each)."""
    words = ("repo", "file", "line", "test", "diff", "func", "call", "type", "path", "args")
    body = " ".join(f"{rng.choice(words)}{rng.randrange(1000):03d}" for _ in range(tokens // 2))
    text = f"[{topic}] {body}"
    return text[: tokens * 4]
