"""What `plait serve --config examples/serve.toml` lets requests run: two agents, a tool and
a function. A request names them; it never sends code.

Defining `registry` says exactly what is exposed; without it the service would register
every agent, tool and function this module defines at its top level.
"""

from __future__ import annotations

from agents import Agent, tool
from orchestrator import Registry, TaskContext

researcher = Agent(
    "researcher",
    "You are a careful researcher. List the facts that answer the question, one per line.",
    max_tokens=96,
)
writer = Agent(
    "writer",
    "You are a concise technical writer. Write a short paragraph from the notes given.",
    max_tokens=128,
)


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: the text to count.
    """
    return len(text.split())


def combine(ctx: TaskContext) -> str:
    """Join the task's inputs, in the order of their task ids."""
    return "\n\n".join(str(ctx.inputs[k]) for k in sorted(ctx.inputs))


registry = Registry(researcher, writer, word_count, combine)
