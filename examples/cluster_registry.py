"""What the engines of examples/cluster.toml run: an agent, a CPU-heavy tool that runs on
the Ray cluster, and a function. A request names them; it never sends code."""

from __future__ import annotations

from agents import Agent, Tool
from executors import RayRunner
from orchestrator import Registry, TaskContext

writer = Agent(
    "writer",
    "You are a concise technical writer. Write one short paragraph from the notes given.",
    max_tokens=96,
)


def count_primes(start: int, stop: int) -> int:
    """Count the primes in [start, stop): CPU work for a Ray worker.

    Args:
        start: the first number looked at.
        stop: one past the last.
    """
    return sum(
        1 for n in range(max(start, 2), stop) if all(n % d for d in range(2, int(n**0.5) + 1))
    )


primes = Tool("primes", count_primes, runner=RayRunner(num_cpus=1))


def total(ctx: TaskContext) -> int:
    """The sum of the task's numeric inputs."""
    return sum(v for v in ctx.inputs.values() if isinstance(v, int))


registry = Registry(writer, primes, total)
